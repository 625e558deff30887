package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
)

// DefaultPrefix is the prefix of every key and channel of a Store unless WithPrefix sets
// another.
const DefaultPrefix = "guard:"

// Sentinel errors. The errors of a Store wrap them, or the driver's error, with detail.
var (
	// ErrUnexpectedReply reports a script reply the Store cannot read: a server that does not
	// run the Store's scripts as written, or keys written by something else.
	ErrUnexpectedReply = errors.New("guard/redisstore: unexpected reply")
	// ErrSubscriptionClosed reports a Watch on a closed Subscription.
	ErrSubscriptionClosed = errors.New("guard/redisstore: subscription closed")
)

var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = redis.NewScript(acquireSrc)

	//go:embed extend.lua
	extendSrc    string
	extendScript = redis.NewScript(extendSrc)

	//go:embed release.lua
	releaseSrc    string
	releaseScript = redis.NewScript(releaseSrc)
)

// Store is a guard.Backend and guard.Notifier on Redis. It is safe for concurrent use. It does
// not own its client: closing the client is the caller's job, after the Guard using the
// Store is closed.
type Store struct {
	client redis.UniversalClient
	prefix string

	// Health checks of a Subscription's connection: idleCheck and pongTimeout in notify.go,
	// fields so that tests can shorten them.
	idleCheck, pongTimeout time.Duration
}

var (
	_ guard.Backend  = (*Store)(nil)
	_ guard.Notifier = (*Store)(nil)
)

// Option configures a Store. Pass options to New.
type Option func(*Store)

// WithPrefix sets the prefix of every key and channel of the Store, so that several
// applications can share one Redis. Default: DefaultPrefix ("guard:"). p must not contain
// '{' or '}': the Store puts the lock name in a Cluster hash tag right after the prefix.
func WithPrefix(p string) Option {
	if strings.ContainsAny(p, "{}") {
		panic(fmt.Sprintf("guard/redisstore: WithPrefix(%q): the prefix must not contain '{' or '}'", p))
	}
	return func(s *Store) { s.prefix = p }
}

// New returns a Store that keeps locks in the Redis that client talks to: a *redis.Client, a
// *redis.ClusterClient, or a failover client from redis.NewFailoverClient. It panics when
// client is nil or an option is invalid.
func New(client redis.UniversalClient, opts ...Option) *Store {
	if client == nil {
		panic("guard/redisstore: New: nil client")
	}
	s := &Store{client: client, prefix: DefaultPrefix, idleCheck: idleCheck, pongTimeout: pongTimeout}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	return s
}

// Suffixes of a lock's other keys and of its channel, after its lock key.
const (
	fenceSuffix   = ":fence"
	channelSuffix = ":released"
)

// lockKey returns the key that holds name's owner token: <prefix>{<name>}.
//
// Redis Cluster hashes only the hash tag of a key: the bytes between its first '{' and the
// first '}' after it, when there is at least one. The prefix has no braces, so that '{' is
// the one before the name, and the '}' that ends the tag is either inside the name (a name
// may contain braces) or the one after it. Either way the tag lies within <prefix>{<name>},
// which the fence key and the channel start with too: a lock's keys always share a slot.
//
// One case needs care: a name that starts with '}' would give an empty tag "{}", and Redis
// then hashes the whole key, sending the fence key elsewhere. Such names get a NUL byte
// before them inside the braces: the tag is then "\x00", the same for both keys. No lock name
// contains NUL (guard.CheckName), so no other name maps to those keys.
func (s *Store) lockKey(name string) string {
	if strings.HasPrefix(name, "}") {
		return s.prefix + "{\x00" + name + "}"
	}
	return s.prefix + "{" + name + "}"
}

// channel returns the channel that a release of name is published on.
func (s *Store) channel(name string) string { return s.lockKey(name) + channelSuffix }

// nameOf returns the lock name whose release channel is ch.
func (s *Store) nameOf(ch string) (string, bool) {
	rest, ok := strings.CutPrefix(ch, s.prefix+"{")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, "}"+channelSuffix)
	if !ok || name == "" {
		return "", false
	}
	return strings.TrimPrefix(name, "\x00"), true
}

// millis returns d in whole milliseconds for PX and PEXPIRE, rounded up: the server keeps a
// lock at least as long as its owner was told.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Acquire makes one attempt to take name for token with a lease of ttl: one EVALSHA of
// acquire.lua. It returns the new fence, a *guard.BusyError with the holder's remaining lease
// when someone else holds name, or a backend error that wraps the driver's error (or
// ErrUnexpectedReply) and does not match guard.ErrNotAcquired.
func (s *Store) Acquire(ctx context.Context, name, token string, ttl time.Duration) (uint64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("guard/redisstore: acquire %q: lease %v is not positive", name, ttl)
	}
	key := s.lockKey(name)
	reply, err := acquireScript.Run(ctx, s.client, []string{key, key + fenceSuffix}, token, millis(ttl)).Slice()
	if err != nil {
		return 0, fmt.Errorf("guard/redisstore: acquire %q: %w", name, err)
	}
	if len(reply) == 2 {
		switch reply[0] {
		case int64(1):
			if v, ok := reply[1].(string); ok {
				if fence, err := strconv.ParseUint(v, 10, 64); err == nil {
					return fence, nil
				}
			}
		case int64(0):
			if pttl, ok := reply[1].(int64); ok {
				return 0, &guard.BusyError{Name: name, Remaining: max(time.Duration(pttl)*time.Millisecond, 0)}
			}
		}
	}
	return 0, fmt.Errorf("guard/redisstore: acquire %q: %w %v", name, ErrUnexpectedReply, reply)
}

// Extend sets the lease of each lock in leases that its token still holds: one EVALSHA of
// extend.lua per lease, all sent in one pipeline (one round trip per Cluster node involved).
// It returns one error per lease, in order: nil when extended, an error matching
// guard.ErrNotHeld when the name is free or held by another token, or a backend error that
// wraps the driver's error.
func (s *Store) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := make([]error, len(leases))
	if len(leases) == 0 {
		return errs
	}
	cmds := make([]*redis.Cmd, len(leases))
	s.pipeline(ctx, leases, cmds, func(pipe redis.Pipeliner, l guard.Lease) *redis.Cmd {
		return extendScript.EvalSha(ctx, pipe, []string{s.lockKey(l.Name)}, l.Token, millis(l.TTL))
	})
	// A server without the script answers NOSCRIPT: send just those leases again, with the
	// script itself, in one more pipeline. EVAL caches the script on that server.
	var retry []guard.Lease
	var at []int
	for i, c := range cmds {
		if c != nil && isNoScript(c.Err()) {
			retry = append(retry, leases[i])
			at = append(at, i)
		}
	}
	if len(retry) > 0 {
		again := make([]*redis.Cmd, len(retry))
		s.pipeline(ctx, retry, again, func(pipe redis.Pipeliner, l guard.Lease) *redis.Cmd {
			return extendScript.Eval(ctx, pipe, []string{s.lockKey(l.Name)}, l.Token, millis(l.TTL))
		})
		for j, i := range at {
			cmds[i] = again[j]
		}
	}
	for i, l := range leases {
		errs[i] = extendResult(l, cmds[i])
	}
	return errs
}

// pipeline queues one command per lease, skipping leases whose TTL is not positive, and sends
// them in one Pipelined call. Each command carries its own reply or error: go-redis sets the
// error of every command that a failed pipeline left without a reply.
func (s *Store) pipeline(ctx context.Context, leases []guard.Lease, cmds []*redis.Cmd,
	queue func(redis.Pipeliner, guard.Lease) *redis.Cmd,
) {
	_, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, l := range leases {
			if l.TTL > 0 {
				cmds[i] = queue(pipe, l)
			}
		}
		return nil
	})
}

// extendResult turns the reply to one extend.lua into Extend's error for l.
func extendResult(l guard.Lease, c *redis.Cmd) error {
	if c == nil {
		return fmt.Errorf("guard/redisstore: extend %q: lease %v is not positive", l.Name, l.TTL)
	}
	if err := c.Err(); err != nil {
		return fmt.Errorf("guard/redisstore: extend %q: %w", l.Name, err)
	}
	switch c.Val() {
	case int64(1):
		return nil
	case int64(0):
		return fmt.Errorf("guard/redisstore: extend %q: %w", l.Name, guard.ErrNotHeld)
	}
	return fmt.Errorf("guard/redisstore: extend %q: %w %v", l.Name, ErrUnexpectedReply, c.Val())
}

// isNoScript reports whether err is a server's answer that it does not have the script.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// Release gives name up if token holds it: one EVALSHA of release.lua. With keep > 0 the
// name stays locked and its lease is set to keep, and nobody is notified; otherwise the lock
// key is deleted and a notification is published on the name's channel. The fence key is
// kept. Release returns an error matching guard.ErrNotHeld when token does not hold name, or
// a backend error that wraps the driver's error.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	key := s.lockKey(name)
	n, err := releaseScript.Run(ctx, s.client, []string{key},
		token, millis(max(keep, 0)), key+channelSuffix, name).Result()
	if err != nil {
		return fmt.Errorf("guard/redisstore: release %q: %w", name, err)
	}
	switch n {
	case int64(1):
		return nil
	case int64(0):
		return fmt.Errorf("guard/redisstore: release %q: %w", name, guard.ErrNotHeld)
	}
	return fmt.Errorf("guard/redisstore: release %q: %w %v", name, ErrUnexpectedReply, n)
}
