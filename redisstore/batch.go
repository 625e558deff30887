package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultPipelines is how many of the lock path's commands, or batches of them, a Store has
// on the wire at once to each master, unless WithPipelines says otherwise.
const DefaultPipelines = 8

// WithPipelines sets how many of the lock path's scripts — acquire.lua and release.lua, each
// a caller's own or a batch of several callers' — a Store has on the wire at once to each
// master (default DefaultPipelines). Up to n concurrent calls go out as they come, each on a
// connection of its own; a call that finds n out waits for the next to come back, and goes
// out with every call that waited beside it in one pipeline: one write and one read for all
// of them, on the client and on the server. With 64 goroutines taking and releasing locks at
// once that is about twice the operations a second at half the CPU each
// (docs/performance.md); fewer than n see no change. Each call still ends with its context.
// Batched commands reach go-redis hooks through ProcessPipelineHook rather than ProcessHook.
// n = 0 turns batching off: every call then waits for a connection of go-redis's pool.
// Renewals are batched anyway (one pipeline per master), and the other operations are not.
// n must not be negative; keep the client's PoolSize (a node's, on a Cluster) above n.
func WithPipelines(n int) Option {
	return func(o *options) { o.pipelines = n }
}

// batcher sends the lock path's scripts of concurrent callers to one master together: at
// most lanes calls or batches are out at once; a call that finds them all out waits in the
// queue, and the next lane to come back sends everything queued, in one pipeline. The queue
// is not empty only while every lane is out, and a lane coming back takes it: no call waits
// for a lane that nobody will bring back.
type batcher struct {
	lanes int // 0: no batching

	mu    sync.Mutex // protects busy and queue
	busy  int        // lanes out
	queue []*batchCall
}

// batchCall is a call waiting in a queue for its reply.
type batchCall struct {
	ctx  context.Context
	sc   *script
	args []any
	cmd  *redis.Cmd    // its command, once sent
	done chan struct{} // told once cmd has its reply
}

// batcherFor returns the batcher of the master of name's keys — of the Store, unless it is
// on a Cluster — or nil when batching is off or the master is not known.
func (s *Store) batcherFor(ctx context.Context, name string) *batcher {
	if s.batch.lanes == 0 {
		return nil
	}
	if s.cluster == nil {
		return &s.batch
	}
	// One batcher per master: a master that does not answer holds up its own callers' calls,
	// not those of the others.
	node, err := s.cluster.MasterForKey(ctx, s.lockKey(name))
	if err != nil {
		return nil
	}
	addr := node.Options().Addr
	if b, ok := s.batches.Load(addr); ok {
		return b.(*batcher)
	}
	b, _ := s.batches.LoadOrStore(addr, &batcher{lanes: s.batch.lanes})
	return b.(*batcher)
}

// evalBatched runs the command that evalArgs began through b: on a free lane at once, or in
// the batch that the next lane to come back sends. The call ends with ctx either way: a call
// whose ctx ends while it waits in the queue returns without having been sent, one already
// sent returns as a call that timed out on its connection does — not knowing whether the
// server ran it.
func (s *Store) evalBatched(ctx context.Context, b *batcher, sc *script, args []any) (any, error) {
	b.mu.Lock()
	if b.busy < b.lanes && len(b.queue) == 0 {
		b.busy++
		b.mu.Unlock()
		defer s.leave(b)
		return s.evalOne(ctx, sc, args)
	}
	c := &batchCall{ctx: ctx, sc: sc, args: args, done: make(chan struct{}, 1)}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.cmd.Result()
	case <-ctx.Done():
	}
	b.forget(c)
	select {
	case <-c.done: // answered in the same moment
		return c.cmd.Result()
	default:
		return nil, context.Cause(ctx)
	}
}

// leave brings a lane of b back: it sends whatever waits in b's queue, or it is free.
func (s *Store) leave(b *batcher) {
	b.mu.Lock()
	batch := b.queue
	b.queue = nil
	if len(batch) == 0 {
		b.busy--
	}
	b.mu.Unlock()
	if len(batch) > 0 {
		go s.sendBatch(b, batch)
	}
}

// forget takes c out of b's queue, if it is still there.
func (b *batcher) forget(c *batchCall) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, q := range b.queue {
		if q == c {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return
		}
	}
}

// sendBatch sends batch's commands in one pipeline on a lane of b — EVALSHA each, then EVAL
// for any the server lacked —, tells each call that its reply is in, and brings the lane
// back. The pipeline runs under the first call's context values, until the last of the
// calls' deadlines (with go-redis's ContextTimeoutEnabled, that bounds a hung connection;
// none when a call has none), and whether or not the callers are still there.
func (s *Store) sendBatch(b *batcher, batch []*batchCall) {
	defer s.leave(b)
	ctx, cancel := batchContext(batch)
	defer cancel()
	for _, c := range batch {
		c.cmd = evalCmd(ctx, c.args)
	}
	_, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range batch {
			_ = pipe.Process(ctx, c.cmd)
		}
		return nil
	})
	for _, c := range batch {
		if isNoScript(c.cmd.Err()) {
			c.cmd = evalCmd(ctx, withSource(c.sc, c.args))
			_ = s.client.Process(ctx, c.cmd)
		}
	}
	for _, c := range batch {
		c.done <- struct{}{}
	}
}

// batchContext returns the context a batch's pipeline runs under: the first call's values,
// no cancellation, and the latest of the calls' deadlines when every call has one.
func batchContext(batch []*batchCall) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var last time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(ctx, last)
}
