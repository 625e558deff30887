package guard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
)

// exclusiveOnly is a backend without shared holds.
type exclusiveOnly struct{ guard.Backend }

func TestPrimitivesNeedTheirBackend(t *testing.T) {
	g := newGuard(t, exclusiveOnly{memstore.New()})
	_, err := g.Semaphore("s", 3)
	assert.ErrorIs(t, err, guard.ErrUnsupported)
	_, err = g.RWMutex("rw")
	assert.ErrorIs(t, err, guard.ErrUnsupported)
	_, err = guard.NewElection(g, "e")
	assert.ErrorIs(t, err, guard.ErrUnsupported, "an Election needs an Inspector")

	ok := newGuard(t, memstore.New())
	_, err = ok.Semaphore("s", 0)
	assert.ErrorIs(t, err, guard.ErrInvalidOption)
	_, err = ok.Semaphore("", 1)
	assert.ErrorIs(t, err, guard.ErrInvalidName)
	_, err = ok.AcquireAll(t.Context(), nil)
	assert.ErrorIs(t, err, guard.ErrInvalidName)
}

// TestNoReentry: work that fans out under a lock's context re-enters the lock in every
// goroutine by default — several goroutines "inside" at once; with NoReentry each one asks the
// backend, and waits for the outer lock like any other caller.
func TestNoReentry(t *testing.T) {
	g := newGuard(t, memstore.New())
	for _, reenter := range []bool{true, false} {
		var inside, most, refused atomic.Int32
		err := g.Do(t.Context(), "fan-out", func(ctx context.Context) error {
			var group errgroup.Group
			for range 4 {
				group.Go(func() error {
					opts := []guard.LockOption{guard.WaitTime(50 * time.Millisecond)}
					if !reenter {
						opts = append(opts, guard.NoReentry())
					}
					inner, err := g.Acquire(ctx, "fan-out", opts...)
					if err != nil {
						refused.Add(1)
						return nil
					}
					defer inner.Release(ctx)
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(10 * time.Millisecond)
					inside.Add(-1)
					return nil
				})
			}
			return group.Wait()
		})
		require.NoError(t, err)
		if reenter {
			assert.Equal(t, int32(4), most.Load(), "every goroutine re-enters the outer lock")
		} else {
			assert.Zero(t, most.Load(), "a goroutine got in beside the outer lock with NoReentry")
			assert.Equal(t, int32(4), refused.Load())
		}
	}
}

// TestSharedHoldsReenter: a reader re-enters its read lock; asking for the write side under it
// would wait for itself, and fails at once.
func TestSharedHoldsReenter(t *testing.T) {
	g := newGuard(t, memstore.New())
	rw, err := g.RWMutex("rw")
	require.NoError(t, err)
	r, err := rw.RLock(t.Context())
	require.NoError(t, err)
	again, err := rw.RLock(r.Context())
	require.NoError(t, err)
	assert.True(t, again.Reentrant())
	_, err = rw.Lock(r.Context())
	assert.ErrorIs(t, err, guard.ErrUpgrade)
	require.NoError(t, again.Release(t.Context()))
	require.NoError(t, r.Release(t.Context()))

	w, err := rw.Lock(t.Context())
	require.NoError(t, err)
	read, err := rw.RLock(w.Context())
	require.NoError(t, err, "a writer re-enters as a reader")
	assert.True(t, read.Reentrant())
	require.NoError(t, read.Release(t.Context()))
	require.NoError(t, w.Release(t.Context()))
}

// TestMultiLockReenters: code that runs under a multi-lock re-enters each of its names.
func TestMultiLockReenters(t *testing.T) {
	g := newGuard(t, memstore.New())
	all, err := g.AcquireAll(t.Context(), []string{"b", "a", "b"})
	require.NoError(t, err)
	assert.Equal(t, "a, b", all.Name())
	require.Len(t, all.Members(), 2)
	assert.Equal(t, all.Members()[0].Fence(), all.Fence())
	one, err := g.Acquire(all.Context(), "b")
	require.NoError(t, err)
	assert.True(t, one.Reentrant())
	require.NoError(t, one.Release(t.Context()))
	require.NoError(t, all.Release(t.Context()))
	assert.ErrorIs(t, all.Err(), guard.ErrReleased)
	for _, m := range all.Members() {
		assert.ErrorIs(t, m.Err(), guard.ErrReleased)
	}
	assert.Zero(t, guard.HeldLocks(g))
}

// TestCallersShareAnOptionSlice: callers may pass one slice of options with room to spare
// (opts...) from many goroutines; each acquisition must see its own kind, never another's.
// A read lock taken as a write lock (or the reverse) would show as a reader alone while
// another reader holds, or as writers together.
func TestCallersShareAnOptionSlice(t *testing.T) {
	g := newGuard(t, memstore.New())
	rw, err := g.RWMutex("rw")
	require.NoError(t, err)
	opts := make([]guard.LockOption, 1, 8)
	opts[0] = guard.WaitTime(5 * time.Second)
	var readers, writers atomic.Int32
	var bad atomic.Int32
	var eg errgroup.Group
	for i := range 16 {
		eg.Go(func() error {
			for range 50 {
				take, in := rw.RLock, &readers
				if i%2 == 1 {
					take, in = rw.Lock, &writers
				}
				l, err := take(t.Context(), opts...)
				if err != nil {
					return err
				}
				n := in.Add(1)
				if (in == &writers && (n > 1 || readers.Load() > 0)) || (in == &readers && writers.Load() > 0) {
					bad.Add(1)
				}
				if l.Kind() != map[bool]guard.Kind{true: guard.KindRead, false: guard.KindWrite}[in == &readers] {
					bad.Add(1)
				}
				in.Add(-1)
				if err := l.Release(context.Background()); err != nil {
					return err
				}
			}
			return nil
		})
	}
	require.NoError(t, eg.Wait())
	assert.Zero(t, bad.Load(), "an acquisition took another's kind")
}

// TestElectionCheckAfterALostTerm: Check reports a lost term until the instance campaigns
// again (or resigns): a candidate waiting behind a new leader is healthy, so that a liveness
// probe does not restart every instance that once lost a term.
func TestElectionCheckAfterALostTerm(t *testing.T) {
	store := memstore.New()
	short := guard.WithWatchdogTimeout(600 * time.Millisecond) // a lost term is seen within 200 ms
	a, b := newGuard(t, store, short), newGuard(t, store, short)
	ea, err := guard.NewElection(a, "leader")
	require.NoError(t, err)
	eb, err := guard.NewElection(b, "leader")
	require.NoError(t, err)
	term, err := ea.Campaign(t.Context(), "a")
	require.NoError(t, err)
	require.NoError(t, store.ForceRelease(t.Context(), "leader", term.Fence()))
	_, err = eb.Campaign(t.Context(), "b")
	require.NoError(t, err)
	select {
	case <-term.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lost term's context did not end")
	}
	require.Eventually(t, func() bool { return errors.Is(ea.Check(), guard.ErrLockLost) }, 5*time.Second,
		10*time.Millisecond, "a lost term")

	ctx, cancel := context.WithCancel(t.Context())
	campaigning := make(chan error, 1)
	go func() {
		_, err := ea.Campaign(ctx, "a")
		campaigning <- err
	}()
	require.Eventually(t, func() bool { return ea.Check() == nil }, 5*time.Second, 10*time.Millisecond,
		"campaigning again clears the lost term")
	cancel()
	require.Error(t, <-campaigning)
	require.NoError(t, eb.Check())
}

// TestElectionEndsWithItsContext: a term ends with the context it was campaigned with, and is
// released then, so the next candidate leads at once — not after a lease the watchdog kept
// renewing for nobody (Resign found no term to release).
func TestElectionEndsWithItsContext(t *testing.T) {
	store := memstore.New()
	a, b := newGuard(t, store), newGuard(t, store)
	ea, err := guard.NewElection(a, "leader")
	require.NoError(t, err)
	eb, err := guard.NewElection(b, "leader")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	term, err := ea.Campaign(ctx, "a")
	require.NoError(t, err)
	cancel()
	<-term.Done()
	wait, stop := context.WithTimeout(t.Context(), 5*time.Second) // far below the 30 s lease
	defer stop()
	next, err := eb.Campaign(wait, "b")
	require.NoError(t, err, "the next candidate leads once the first term's context ended")
	assert.Greater(t, next.Fence(), term.Fence())
	assert.NoError(t, ea.Resign(t.Context()))
}

// TestElectionCheckAfterAHandOver: a term handed over by the queue starts with the shorter
// lease of a waiter's place and is renewed a third of the way into it; Check must call it
// healthy meanwhile (it said "not renewed" for about 1.5 s after every hand-over, and a
// liveness probe would have restarted a healthy new leader).
func TestElectionCheckAfterAHandOver(t *testing.T) {
	store := memstore.New()
	a, b := newGuard(t, store), newGuard(t, store)
	ea, err := guard.NewElection(a, "leader")
	require.NoError(t, err)
	eb, err := guard.NewElection(b, "leader")
	require.NoError(t, err)
	_, err = ea.Campaign(t.Context(), "a")
	require.NoError(t, err)
	won := make(chan error, 1)
	go func() {
		_, err := eb.Campaign(t.Context(), "b")
		won <- err
	}()
	require.Eventually(t, func() bool {
		info, err := store.Inspect(t.Context(), "leader")
		return err == nil && info.Waiting == 1
	}, 5*time.Second, 5*time.Millisecond, "b never queued")
	require.NoError(t, ea.Resign(t.Context()))
	require.NoError(t, <-won)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		require.NoError(t, eb.Check(), "the new leader's term, just handed over")
	}
}
