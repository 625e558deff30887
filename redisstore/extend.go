package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
)

// extendChunk is the most leases one extend.lua renews. A script blocks the server while it
// runs: 256 renewals take it a fraction of a millisecond, and cut the commands a watchdog sends
// by as much.
const extendChunk = 256

// Extend sets the lease of each lock in leases that its token still holds, exclusive or
// shared: extend.lua renews up to 256 leases of one Cluster slot in one call, and all the
// calls go in one pipeline (one round trip per Cluster node involved; under WithReplicaAcks,
// one pipeline per master, each ending in WAIT), in the order of leases, so that a lock named
// twice keeps its last lease. It returns one error per lease, in order: nil when extended,
// guard.ErrNotHeld when the name is free or held by another token, or the driver's error.
func (s *Store) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := make([]error, len(leases))
	calls := s.extendCalls(leases, errs)
	if len(calls) == 0 {
		return errs
	}
	if s.acks > 0 {
		s.extendAcked(ctx, leases, calls, errs)
		return errs
	}
	s.extendPipeline(ctx, s.client, calls, false)
	for _, c := range calls {
		c.answer(errs, nil)
	}
	return errs
}

// extendCall is one extend.lua: the leases at indexes at, all of one Cluster slot.
type extendCall struct {
	at     []int
	keys   []string // 4 a lease
	tokens []string
	ttls   []any // each lease's TTL in milliseconds, one boxed value while they repeat
	cmd    *redis.Cmd
}

// command returns c's command: name (evalsha or eval) and script (its hash or source), the
// keys, then the arguments. Keys and tokens go in as pointers into c's slices, which go-redis
// writes as the strings they point to: boxing each string instead would allocate once a key.
func (c *extendCall) command(name, script string) []any {
	args := make([]any, 0, 4+len(c.keys)+2*len(c.tokens))
	args = append(args, name, script, len(c.keys))
	for i := range c.keys {
		args = append(args, &c.keys[i])
	}
	args = append(args, retentionArg)
	for i := range c.tokens {
		args = append(args, &c.tokens[i], c.ttls[i])
	}
	return args
}

// extendCalls groups leases into calls of extend.lua: by Cluster slot (one group on a single
// node), each group in the order of leases, cut at extendChunk leases. A lease whose TTL is not
// positive gets its error in errs and no call.
func (s *Store) extendCalls(leases []guard.Lease, errs []error) []*extendCall {
	var calls []*extendCall
	var open map[uint16]*extendCall // the call of each slot that has room left
	var last *extendCall            // the call with room left on a single node
	var ttlArg any
	var ttlMillis int64 = -1
	for i, l := range leases {
		if l.TTL <= 0 {
			errs[i] = fmt.Errorf("redisstore: lease %v is not positive", l.TTL)
			continue
		}
		c := last
		var slot uint16
		if s.cluster != nil {
			if open == nil {
				open = make(map[uint16]*extendCall)
			}
			slot = keySlot(s.lockKey(l.Name))
			c = open[slot]
		}
		if c == nil || len(c.at) == extendChunk {
			n := min(len(leases)-i, extendChunk)
			c = &extendCall{at: make([]int, 0, n), keys: make([]string, 0, 4*n), tokens: make([]string, 0, n), ttls: make([]any, 0, n)}
			calls = append(calls, c)
			if s.cluster != nil {
				open[slot] = c
			} else {
				last = c
			}
		}
		if ms := millis(l.TTL); ms != ttlMillis {
			ttlMillis, ttlArg = ms, ms // one boxed TTL while they repeat
		}
		c.at = append(c.at, i)
		c.keys = s.extendKeys(c.keys, l.Name)
		c.tokens = append(c.tokens, l.Token)
		c.ttls = append(c.ttls, ttlArg)
	}
	return calls
}

// extendKeys appends extend.lua's keys of name — its lock, fence, shared holders and their
// data — to dst, in one string.
func (s *Store) extendKeys(dst []string, name string) []string {
	open := "{"
	if strings.HasPrefix(name, "}") {
		open = "{\x00" // see lockKey
	}
	suffixes := [...]string{"", fenceSuffix, sharedSuffix, holdersSuffix}
	n := len(s.prefix) + len(open) + len(name) + 1
	var b strings.Builder
	b.Grow(4*n + len(fenceSuffix) + len(sharedSuffix) + len(holdersSuffix))
	var ends [len(suffixes)]int
	for i, suffix := range suffixes {
		b.WriteString(s.prefix)
		b.WriteString(open)
		b.WriteString(name)
		b.WriteByte('}')
		b.WriteString(suffix)
		ends[i] = b.Len()
	}
	all, from := b.String(), 0
	for _, end := range ends {
		dst = append(dst, all[from:end])
		from = end
	}
	return dst
}

// extendAcked sends calls under WithReplicaAcks: one pipeline per master, each ending in WAIT.
func (s *Store) extendAcked(ctx context.Context, leases []guard.Lease, calls []*extendCall, errs []error) {
	var nodes []redis.Cmdable
	byNode := make(map[redis.Cmdable][]*extendCall)
	for _, c := range calls {
		node, err := s.nodeFor(ctx, leases[c.at[0]].Name)
		if err != nil {
			for _, i := range c.at {
				errs[i] = err
			}
			continue
		}
		if _, ok := byNode[node]; !ok {
			nodes = append(nodes, node)
		}
		byNode[node] = append(byNode[node], c)
	}
	var wg sync.WaitGroup
	for _, node := range nodes {
		wg.Go(func() {
			part := byNode[node]
			waitErr := s.extendPipeline(ctx, node, part, true)
			for _, c := range part {
				c.answer(errs, waitErr)
			}
		})
	}
	wg.Wait()
}

// extendPipeline sends calls in one round trip, with a WAIT after them when wait is set; the
// calls answered NOSCRIPT are sent again with the script itself. It returns WAIT's verdict.
// Each call keeps its own reply or error: go-redis sets the error of every command that a
// failed pipeline left without a reply.
func (s *Store) extendPipeline(ctx context.Context, c redis.Cmdable, calls []*extendCall, wait bool) error {
	send := func(useSHA bool, calls []*extendCall) *redis.Cmd {
		var w *redis.Cmd
		_, _ = c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, call := range calls {
				if useSHA {
					call.cmd = pipe.Do(ctx, call.command("evalsha", extendScript.Hash())...)
				} else {
					call.cmd = pipe.Do(ctx, call.command("eval", extendSrc)...)
				}
			}
			if wait {
				w = s.wait(ctx, pipe)
			}
			return nil
		})
		return w
	}
	w := send(true, calls)
	// A server without the script (a restart, SCRIPT FLUSH) answers NOSCRIPT: send just
	// those again with the script itself, which caches it there.
	var retry []*extendCall
	for _, call := range calls {
		if isNoScript(call.cmd.Err()) {
			retry = append(retry, call)
		}
	}
	if len(retry) > 0 {
		w = send(false, retry)
	}
	if wait {
		return s.acked(w)
	}
	return nil
}

// answer puts the reply of c into errs: nil for a lease extended (or waitErr, when replicas did
// not acknowledge it), guard.ErrNotHeld for one not held, the call's error for all of them.
func (c *extendCall) answer(errs []error, waitErr error) {
	if err := c.cmd.Err(); err != nil {
		for _, i := range c.at {
			errs[i] = err
		}
		return
	}
	vals, ok := c.cmd.Val().([]any)
	if !ok || len(vals) != len(c.at) {
		err := fmt.Errorf("%w %v", ErrUnexpectedReply, c.cmd.Val())
		for _, i := range c.at {
			errs[i] = err
		}
		return
	}
	for j, i := range c.at {
		switch vals[j] {
		case int64(1):
			errs[i] = waitErr
		case int64(0):
			errs[i] = guard.ErrNotHeld
		default:
			errs[i] = fmt.Errorf("%w %v", ErrUnexpectedReply, vals[j])
		}
	}
}
