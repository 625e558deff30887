package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
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
// (docs/performance.md); fewer than n see no change. A call that waits for a lane, or for the
// reply of its batch, returns when its context ends, and an acquisition the server grants
// after its caller left is given back; a call on a lane of its own ends as go-redis lets it
// (at its deadline under ContextTimeoutEnabled). Batched commands reach go-redis hooks through
// ProcessPipelineHook rather than ProcessHook.
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
	ctx   context.Context
	sc    *script
	args  []any
	name  string
	token string // an acquisition's token, "" for other scripts

	cmd   *redis.Cmd    // its command, once sent
	done  chan struct{} // told once cmd has its reply
	state atomic.Int32  // callWaiting, callAnswered or callLeft
}

// A sent batchCall's state: its caller waits for the reply, has it, or left before it came.
const (
	callWaiting int32 = iota
	callAnswered
	callLeft
)

// giveBackTimeout bounds a batch's give-back of the grants whose callers left (see
// sendBatch): the wait for a connection and, with go-redis's ContextTimeoutEnabled, the
// round trip.
const giveBackTimeout = 5 * time.Second

// batcherFor returns the batcher of the master of lockKey — of the Store, unless it is on a
// Cluster — or nil when batching is off or the master is not known.
func (s *Store) batcherFor(ctx context.Context, lockKey string) *batcher {
	if s.batch.lanes == 0 {
		return nil
	}
	if s.cluster == nil {
		return &s.batch
	}
	// One batcher per master: a master that does not answer holds up its own callers' calls,
	// not those of the others.
	node, err := s.cluster.MasterForKey(ctx, lockKey)
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

// evalBatched runs the command that evalArgs began, for token on name, through b: on a free
// lane at once (as evalOne does), or in the batch that the next lane to come back sends. A
// call that waits ends with its context: one still in the queue returns without having been
// sent; one already sent returns as a call that timed out on its connection does, not
// knowing whether the server ran it — and if the server granted an acquisition to a caller
// that left so, the batch gives the grant back when the reply comes (sendBatch): a reply of a
// batch deep in the server's input can come after every give-back of the caller's Guard.
func (s *Store) evalBatched(ctx context.Context, b *batcher, sc *script, name, token string, args []any) (any, error) {
	b.mu.Lock()
	if b.busy < b.lanes && len(b.queue) == 0 {
		b.busy++
		b.mu.Unlock()
		defer s.leave(b)
		return s.evalOne(ctx, sc, args)
	}
	c := &batchCall{ctx: ctx, sc: sc, args: args, name: name, token: token, done: make(chan struct{}, 1)}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.cmd.Result()
	case <-ctx.Done():
	}
	if b.forget(c) || c.state.CompareAndSwap(callWaiting, callLeft) {
		return nil, context.Cause(ctx) // unsent, or sent and left to the batch
	}
	<-c.done // answered in the same moment
	return c.cmd.Result()
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

// forget takes c out of b's queue; it reports whether c was still there, unsent.
func (b *batcher) forget(c *batchCall) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, q := range b.queue {
		if q == c {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return true
		}
	}
	return false
}

// sendBatch sends batch's commands in one pipeline on a lane of b, tells each call that its
// reply is in, brings the lane back, and then gives back what the acquisitions whose callers
// left were granted. A call whose caller left before it was sent is not sent. The pipeline runs
// under the first call's context values, until batchGrace after the last of the calls'
// deadlines (with go-redis's ContextTimeoutEnabled, that bounds a hung connection; none when a
// call has none), whether or not the callers are still there.
func (s *Store) sendBatch(b *batcher, batch []*batchCall) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	send := make([]*batchCall, 0, len(batch))
	for _, c := range batch {
		if c.state.Load() != callLeft {
			send = append(send, c)
		}
	}
	if len(send) > 0 {
		s.sendAll(ctx, send)
	}
	var left []*batchCall
	for _, c := range send {
		if c.state.CompareAndSwap(callWaiting, callAnswered) {
			c.done <- struct{}{}
		} else if c.token != "" && c.cmd.Err() == nil {
			left = append(left, c)
		}
	}
	s.leave(b)
	if len(left) > 0 {
		s.giveBack(ctx, left)
	}
}

// sendAll sends calls' commands in one pipeline — EVALSHA each, then, in a second pipeline,
// EVAL for those the server lacked — and sets each call's cmd.
func (s *Store) sendAll(ctx context.Context, calls []*batchCall) {
	for _, c := range calls {
		c.cmd = evalCmd(ctx, c.args)
	}
	s.pipeline(ctx, calls)
	var missing []*batchCall
	for _, c := range calls {
		if isNoScript(c.cmd.Err()) {
			c.cmd = evalCmd(ctx, withSource(c.sc, c.args))
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		s.pipeline(ctx, missing)
	}
}

// pipeline sends calls' commands in one pipeline (several, one per master, on a Cluster).
func (s *Store) pipeline(ctx context.Context, calls []*batchCall) {
	_, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range calls {
			_ = pipe.Process(ctx, c.cmd)
		}
		return nil
	})
}

// giveBack releases what the server gave the tokens of left — a lock, or a place in a queue —
// after their callers left while their acquisitions were on the wire: in one pipeline, not
// through the batcher, so that it never waits for a lane of the batch it comes from. Their
// Guards give the tokens back too, but those releases may all have come before the grants.
func (s *Store) giveBack(ctx context.Context, left []*batchCall) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	back := make([]*batchCall, len(left))
	for i, c := range left {
		back[i] = &batchCall{sc: releaseScript, args: s.releaseArgs(c.name, c.token, 0)}
	}
	s.sendAll(ctx, back)
	for i, c := range left {
		_ = s.released(c.name, c.token, back[i].cmd.Val(), back[i].cmd.Err())
	}
}

// batchContext returns the context a batch's pipeline runs under: the first call's values,
// no cancellation, and — when every call has a deadline — the latest of them plus batchGrace.
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
	return context.WithDeadline(ctx, last.Add(batchGrace))
}

// batchGrace is how long a batch's pipeline outlives the last of its callers' deadlines: so
// that each caller's own context ends first, and its call returns the context's error rather
// than the connection's; and so that a batch that a busy or paused server answers late still
// hears the grants of callers that left, and gives them back.
const batchGrace = 5 * time.Second
