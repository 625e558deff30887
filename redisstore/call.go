package redisstore

import (
	"context"
	"hash/maphash"
	"slices"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// The uncontended lock path — acquire.lua, then release.lua — builds its commands itself
// rather than through redis.Script: go-redis would box each of the six keys, the digest and
// the argument slice anew for every call, ten allocations or more per script on the path of
// every lock. Here the digest and source are boxed once, a name's keys are boxed once and
// kept in a small cache (a release follows the acquisition of the same name), and the
// command's arguments are one slice. The commands go out as go-redis would send them
// (EVALSHA, then EVAL when the server lacks the script), with the same argument types, so
// hooks and tracing see what they always saw — in a pipeline when concurrent calls are
// batched (batch.go).

// script is one of the Store's scripts, with its digest and source boxed as command
// arguments.
type script struct {
	*redis.Script
	sha, src any
}

func newScript(src string) *script {
	sc := redis.NewScript(src)
	return &script{Script: sc, sha: sc.Hash(), src: src}
}

// nameKeys are the keys of one lock name as lock.lua takes them, K[1] to K[6], and the
// name's release channel, boxed as command arguments.
type nameKeys struct {
	name    string
	keys    [6]any
	channel any
}

// keyCacheSize is how many names' boxed keys a Store keeps: a power of two. A name's entry
// is replaced by any other name that hashes to its place; keeping the keys costs nothing
// then, as they are built anew, as they would be without the cache.
const keyCacheSize = 64

// keyCache keeps the boxed keys of the names a Store used last.
type keyCache struct {
	seed    maphash.Seed
	entries [keyCacheSize]atomic.Pointer[nameKeys]
}

// keysOf returns the boxed keys of name: from the cache, or built (nine allocations) and
// kept there.
func (s *Store) keysOf(name string) *nameKeys {
	e := &s.keyCache.entries[maphash.String(s.keyCache.seed, name)&(keyCacheSize-1)]
	if k := e.Load(); k != nil && k.name == name {
		return k
	}
	keys := s.keys(name)
	k := &nameKeys{name: name, channel: keys[6]}
	for i := range k.keys {
		k.keys[i] = keys[i]
	}
	e.Store(k)
	return k
}

// evalArgs returns the arguments of EVALSHA of sc on k's keys, with room for n script
// arguments after them.
func evalArgs(sc *script, k *nameKeys, n int) []any {
	args := make([]any, 3+len(k.keys), 3+len(k.keys)+n)
	args[0], args[1], args[2] = "evalsha", sc.sha, len(k.keys)
	copy(args[3:], k.keys[:])
	return args
}

// eval runs the command that evalArgs began, on the server of its keys: EVALSHA, then EVAL
// if the server lacks the script; batched with concurrent calls (WithPipelines, batch.go). It
// waits for replicas under WithReplicaAcks, unbatched.
func (s *Store) eval(ctx context.Context, sc *script, name string, args []any) (any, error) {
	return s.evalFor(ctx, sc, name, "", args)
}

// evalAcquire is eval for acquire.lua on behalf of token: if the call is batched and its
// caller leaves while it is on the wire, the batch gives back what the server granted token.
func (s *Store) evalAcquire(ctx context.Context, name, token string, args []any) (any, error) {
	return s.evalFor(ctx, acquireScript, name, token, args)
}

// evalFor is eval, with token set for an acquisition (see evalAcquire).
func (s *Store) evalFor(ctx context.Context, sc *script, name, token string, args []any) (any, error) {
	if s.acks > 0 {
		return s.evalAcked(ctx, sc, name, args)
	}
	// args[3] is the lock key (evalArgs), built once per name by keysOf: not built again here.
	lockKey, _ := args[3].(string)
	if b := s.batcherFor(ctx, lockKey); b != nil {
		return s.evalBatched(ctx, b, sc, name, token, args)
	}
	return s.evalOne(ctx, sc, args)
}

// evalOne runs the command that evalArgs began on a connection of its own: EVALSHA, then EVAL
// if the server lacks the script.
func (s *Store) evalOne(ctx context.Context, sc *script, args []any) (any, error) {
	cmd := evalCmd(ctx, args)
	_ = s.client.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		cmd = evalCmd(ctx, withSource(sc, args))
		_ = s.client.Process(ctx, cmd)
	}
	return cmd.Result()
}

// evalAcked runs the command that evalArgs began and WAIT in one pipeline on the master of
// name's keys.
func (s *Store) evalAcked(ctx context.Context, sc *script, name string, args []any) (any, error) {
	node, err := s.nodeFor(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.pipeAcked(ctx, node, func(useSHA bool, pipe redis.Pipeliner) *redis.Cmd {
		if !useSHA {
			args = withSource(sc, args)
		}
		c := evalCmd(ctx, args)
		_ = pipe.Process(ctx, c)
		return c
	})
}

// pipeAcked sends the script command that send queues on pipe — EVALSHA, then EVAL if the
// server lacks the script — and WAIT after it, in one pipeline on node, and returns the
// script's reply once the replicas acknowledged it.
func (s *Store) pipeAcked(ctx context.Context, node redis.Cmdable, send func(useSHA bool, pipe redis.Pipeliner) *redis.Cmd) (any, error) {
	for _, useSHA := range []bool{true, false} {
		var c, w *redis.Cmd
		_, _ = node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			c = send(useSHA, pipe)
			w = s.wait(ctx, pipe)
			return nil
		})
		if useSHA && isNoScript(c.Err()) {
			continue
		}
		if err := c.Err(); err != nil {
			return nil, err
		}
		if err := s.acked(w); err != nil {
			return nil, err
		}
		return c.Val(), nil
	}
	return nil, errScriptNotLoaded
}

// evalCmd returns the command of args, whose first key is its fourth argument.
func evalCmd(ctx context.Context, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// withSource returns args as EVAL with sc's source: a copy, as the EVALSHA that was sent
// may still be looked at by a hook.
func withSource(sc *script, args []any) []any {
	args = slices.Clone(args)
	args[0], args[1] = "eval", sc.src
	return args
}
