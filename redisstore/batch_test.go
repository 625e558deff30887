package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
)

// pipelineHook counts the pipelines of a client that carried more than one script, and can
// hold every command and pipeline back until released.
type pipelineHook struct {
	batches, batched atomic.Int64 // pipelines of more than one command, and their commands
	hold             atomic.Pointer[chan struct{}]
	held             chan struct{} // told each time a command or pipeline is held
}

func (h *pipelineHook) wait() {
	if c := h.hold.Load(); c != nil {
		h.held <- struct{}{}
		<-*c
	}
}

func (h *pipelineHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.wait()
		return next(ctx, cmd)
	}
}

func (h *pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.wait()
		if len(cmds) > 1 && strings.HasPrefix(cmds[0].Name(), "eval") { // not a new connection's handshake
			h.batches.Add(1)
			h.batched.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

// hooked returns a Store on a new client of d with hook h and opts.
func (d *deployment) hooked(t testing.TB, h *pipelineHook, opts ...Option) *Store {
	c := d.client(t)
	c.AddHook(h)
	return New(c, opts...)
}

// testBatch runs concurrent acquisitions and releases through a Store with one pipeline: the
// calls that find it out go together in the next, each gets its own reply, and one name is
// never held twice — with fences that increase from holder to holder — including after a
// SCRIPT FLUSH, when some commands of a batch answer NOSCRIPT.
func testBatch(t *testing.T, d *deployment) {
	h := &pipelineHook{}
	s := d.hooked(t, h, WithPipelines(1))
	const workers, rounds = 16, 60
	one := uniqueName(t, "one")
	var (
		holders   atomic.Int32
		overlaps  atomic.Int32
		mu        sync.Mutex // protects lastFence and fails
		lastFence uint64
		fails     []error
		held      atomic.Int64
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		fails = append(fails, err)
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			own := uniqueName(t, fmt.Sprint("own", w))
			for r := range rounds {
				if r == rounds/2 && w == 0 {
					d.flushScripts(t)
				}
				tok := fmt.Sprintf("w%d-r%d", w, r)
				// A name of its own: always free.
				if _, err := s.Acquire(t.Context(), guard.Request{Name: own, Token: tok, TTL: time.Minute}); err != nil {
					fail(fmt.Errorf("own name: %w", err))
					return
				}
				if err := s.Release(t.Context(), own, tok, 0); err != nil {
					fail(fmt.Errorf("own release: %w", err))
					return
				}
				// The shared name: held by one of them at a time.
				f, err := s.Acquire(t.Context(), guard.Request{Name: one, Token: tok, TTL: time.Minute})
				if errors.Is(err, guard.ErrNotAcquired) {
					continue
				}
				if err != nil {
					fail(err)
					return
				}
				if holders.Add(1) > 1 {
					overlaps.Add(1)
				}
				mu.Lock()
				if f <= lastFence {
					fails = append(fails, fmt.Errorf("fence %d after %d", f, lastFence))
				}
				lastFence = f
				mu.Unlock()
				held.Add(1)
				holders.Add(-1)
				if err := s.Release(t.Context(), one, tok, 0); err != nil {
					fail(fmt.Errorf("release: %w", err))
					return
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, fails)
	assert.Zero(t, overlaps.Load(), "the shared name was held twice at once")
	assert.Positive(t, held.Load(), "nobody got the shared name")
	assert.Positive(t, h.batches.Load(), "no call went out in a batch")
	t.Logf("%s: %d calls in %d batches of more than one; the shared name held %d times",
		d.kind, h.batched.Load(), h.batches.Load(), held.Load())
}

// TestBatchContextEnds: a call ends with its context while it waits for the Store's one
// pipeline — unsent — and once its batch is on the wire — sent, its outcome unknown to it,
// and what the server grants it given back by the batch (its Guard's own give-backs can all
// come before the grant) — while the other calls of its batch get their replies.
func TestBatchContextEnds(t *testing.T) {
	d := startSingle(t)
	h := &pipelineHook{held: make(chan struct{}, 8)}
	s := d.hooked(t, h, WithPipelines(1))
	admin := d.admin(t)
	ctx := t.Context()
	_, err := s.Acquire(ctx, guard.Request{Name: "warm", Token: "tok", TTL: time.Minute}) // loads the script
	require.NoError(t, err)
	batches := h.batches.Load()
	acquire := func(ctx context.Context, name string) <-chan error {
		got := make(chan error, 1)
		go func() {
			_, err := s.Acquire(ctx, guard.Request{Name: name, Token: "tok", TTL: time.Minute})
			got <- err
		}()
		return got
	}
	queued := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			s.batch.mu.Lock()
			defer s.batch.mu.Unlock()
			return len(s.batch.queue) == n
		}, notifyWait, time.Millisecond, "calls waiting for the pipeline")
	}
	returns := func(got <-chan error, want error) {
		t.Helper()
		select {
		case err := <-got:
			require.ErrorIs(t, err, want)
		case <-time.After(notifyWait):
			t.Fatal("a call whose context ended did not return")
		}
	}

	hold := make(chan struct{})
	h.hold.Store(&hold)
	first := acquire(ctx, "first")
	<-h.held // the Store's one lane is out, held back by the hook

	unsentCtx, giveUp := context.WithCancelCause(ctx)
	unsent := acquire(unsentCtx, "unsent")
	queued(1)
	kept := acquire(ctx, "kept")
	queued(2)
	cause := errors.New("caller gave up")
	giveUp(cause)
	returns(unsent, cause)
	queued(1)

	sentCtx, giveUpSent := context.WithCancelCause(ctx)
	sent := acquire(sentCtx, "sent")
	queued(2)
	held := make(chan struct{})
	h.hold.Store(&held)
	close(hold) // first is answered; its lane sends kept and sent, held back by the hook
	require.NoError(t, <-first)
	<-h.held
	giveUpSent(cause)
	returns(sent, cause)

	h.hold.Store(nil)
	close(held)
	require.NoError(t, <-kept)
	_, err = s.Acquire(ctx, guard.Request{Name: "after", Token: "tok", TTL: time.Minute})
	require.NoError(t, err, "the lane came back")
	for name, want := range map[string]int64{"first": 1, "unsent": 0, "kept": 1, "after": 1} {
		n, err := admin.Exists(ctx, s.lockKey(name)).Result()
		require.NoError(t, err)
		assert.Equal(t, want, n, "%s held", name)
	}
	// The server ran sent's acquisition after its caller left: the batch gave it back.
	n, err := admin.Exists(ctx, s.lockKey("sent")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "an acquisition whose caller left while it was on the wire is held")
	fence, err := admin.Get(ctx, s.lockKey("sent")+fenceSuffix).Result()
	require.NoError(t, err, "sent's acquisition never ran")
	assert.NotEmpty(t, fence)
	assert.Equal(t, int64(1), h.batches.Load()-batches, "kept and sent went in one pipeline")
}

// TestBatchClusterMasterStuck: on a Cluster, a master that does not answer holds up only the
// calls for its own names; the other masters' go on.
func TestBatchClusterMasterStuck(t *testing.T) {
	c := testserver.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = client.Close() })
	s := New(client, WithPipelines(1))
	ctx := t.Context()
	// A name on the first master and one on another.
	m := c.Master(t, 0)
	stuckAddr := m.Addr
	var stuckName, freeName string
	for i := 0; stuckName == "" || freeName == ""; i++ {
		n := fmt.Sprint("n", i)
		_, err := s.Acquire(ctx, guard.Request{Name: n, Token: "warm", TTL: time.Minute}) // loads the script
		require.NoError(t, err)
		require.NoError(t, s.Release(ctx, n, "warm", 0))
		if s.Partition(n) == stuckAddr {
			stuckName = n
		} else {
			freeName = n
		}
	}

	m.Pause(t)
	stuck := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, guard.Request{Name: stuckName, Token: "tok", TTL: time.Minute})
		stuck <- err
	}()
	require.Eventually(t, func() bool {
		b := s.batcherFor(ctx, s.lockKey(stuckName))
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.busy == 1
	}, notifyWait, time.Millisecond, "the call to the paused master should be out")
	other, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := s.Acquire(other, guard.Request{Name: freeName, Token: "tok", TTL: time.Minute})
	require.NoError(t, err, "a call to a master that answers waited for the one that does not")

	m.Resume(t)
	require.NoError(t, <-stuck)
}
