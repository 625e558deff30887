package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/watchdog"
)

// The tests here show that the requests of one lease — its claim, renewals and Extends —
// reach the backend in the order the lease's owner decided them (issue 16, case 1), and the
// rules an Extend keeps: shortening moves the deadline first, an unanswered request keeps the
// lease in doubt, and a MinHold window is never shortened on the server.

// gate is a RenewFunc whose answers the test releases one by one.
type gate struct {
	mu   sync.Mutex // protects sent
	sent []Request
	open chan struct{} // each receive answers one held batch
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) renew(ctx context.Context, batch []Request) ([]Result, []error) {
	g.mu.Lock()
	g.sent = append(g.sent, batch...)
	g.mu.Unlock()
	res := make([]Result, len(batch))
	select {
	case <-g.open:
	case <-ctx.Done():
		for i := range res {
			res[i] = Failed
		}
	}
	return res, make([]error, len(batch))
}

func (g *gate) requests() []Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Request(nil), g.sent...)
}

// TestExtendWaitsForClaimOut: an Extend decided while the claim after a hand-over is on the wire
// is sent after the claim's answer, so the server applies the Extend last.
func TestExtendWaitsForClaimOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const granted, fixed = time.Second, 10 * time.Second
		g := newGate()
		s := New(g.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		l := e.lease("a", 0)
		s.Add(l, Grant{Start: start, HeldAt: start, Granted: granted, Fixed: fixed})
		time.Sleep(granted/3 + time.Millisecond)
		require.Len(t, g.requests(), 1, "the claim is out")

		var order []string
		var mu sync.Mutex
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, err := s.Extend(t.Context(), l, 3*time.Second, func(context.Context, time.Duration) (Result, error) {
				mu.Lock()
				order = append(order, "extend")
				mu.Unlock()
				return Renewed, nil
			})
			assert.NoError(t, err)
		}()
		synctest.Wait()
		mu.Lock()
		assert.Empty(t, order, "the Extend went out while the claim was out")
		order = append(order, "claim answered")
		mu.Unlock()
		g.open <- struct{}{}
		<-done
		extended := time.Now()
		assert.Equal(t, []string{"claim answered", "extend"}, order)
		assert.Equal(t, watchdog.Deadline(extended, 3*time.Second), s.Deadline(l), "the Extend set the lease last")
		time.Sleep(fixed)
		assert.Len(t, g.requests(), 1, "a claim was sent after the Extend")
	})
}

// TestExtendCancelsPendingClaim: an Extend before the claim is due sets the lease itself; the
// claim is never sent, or it would undo the Extend.
func TestExtendCancelsPendingClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := New(g.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		l := e.lease("a", 0)
		s.Add(l, Grant{Start: start, HeldAt: start, Granted: time.Second, Fixed: 10 * time.Second})
		time.Sleep(100 * time.Millisecond)
		_, err := s.Extend(t.Context(), l, 3*time.Second, renewed)
		require.NoError(t, err)
		time.Sleep(time.Minute)
		assert.Empty(t, g.requests(), "the claim went out after the Extend")
		ended := e.all()
		require.Len(t, ended, 1)
		assert.Equal(t, watchdog.Deadline(start.Add(100*time.Millisecond), 3*time.Second), ended[0].at)
	})
}

// TestShorteningExtendMovesDeadlineFirst: the backend may apply an Extend whose answer never
// comes, so one that shortens the lease moves the deadline before it is sent, and a later
// confirmed Extend is trusted no longer than the unanswered one asked for.
func TestShorteningExtendMovesDeadlineFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(newGate().renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		l := e.lease("a", 0)
		s.Add(l, Grant{Start: start, HeldAt: start, Granted: 10 * time.Second, Fixed: 10 * time.Second})

		lost := errors.New("i/o timeout")
		res, err := s.Extend(t.Context(), l, time.Second, func(context.Context, time.Duration) (Result, error) {
			assert.Equal(t, watchdog.Deadline(start, time.Second), s.Deadline(l), "the deadline moved only after the request was sent")
			return Failed, lost
		})
		require.Equal(t, Failed, res)
		require.ErrorIs(t, err, lost)
		assert.Equal(t, watchdog.Deadline(start, time.Second), s.Deadline(l))

		time.Sleep(100 * time.Millisecond)
		_, err = s.Extend(t.Context(), l, 5*time.Second, renewed)
		require.NoError(t, err)
		assert.Equal(t, watchdog.Deadline(time.Now(), time.Second), s.Deadline(l),
			"trusted for longer than the unanswered request, which may still be applied after it")
	})
}

// TestExtendKeepsMinHold: an Extend never asks the server for less than the rest of the MinHold
// window, though the lease's own deadline is as short as asked; Release says what is left of
// the window. Both add the drift (1 % + 2 ms), so that a server whose clock runs up to 1 % fast
// keeps the window to its end by ours.
func TestExtendKeepsMinHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(newGate().renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		l := e.lease("a", 0)
		s.Add(l, Grant{Start: start, HeldAt: start, Granted: 2 * time.Second, Fixed: 2 * time.Second, MinHold: 2 * time.Second})
		time.Sleep(100 * time.Millisecond)
		var asked time.Duration
		_, err := s.Extend(t.Context(), l, 50*time.Millisecond, func(_ context.Context, ttl time.Duration) (Result, error) {
			asked = ttl
			return Renewed, nil
		})
		require.NoError(t, err)
		assert.Equal(t, 1921*time.Millisecond, asked, "the server's lease must cover the MinHold window, and the drift")
		assert.Equal(t, watchdog.Deadline(time.Now(), 50*time.Millisecond), s.Deadline(l))

		keep, first := s.Release(l)
		assert.True(t, first)
		assert.Equal(t, 1921*time.Millisecond, keep)
		_, first = s.Release(l)
		assert.False(t, first, "released twice")
	})
}

// TestNearestDeadlinesGoFirst: more renewals are due at once than one batch holds. They go in
// batches of at most maxBatchLen, each in the order of the leases' deadlines, and the first
// batch holds the leases nearest their deadline, so that when not every batch can be out, the
// ones left to wait are the leases with the most time left (issue 21). It failed on the old
// code: one batch of every lease, in the order they were added.
func TestNearestDeadlinesGoFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			ttl = 3 * time.Second
			n   = 2*maxBatchLen + 100
		)
		b := &fakeBackend{}
		s := New(b.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		for i := range n {
			rank := n - 1 - i // the latest deadline is added first
			e.add(s, e.lease(fmt.Sprintf("%05d", rank), ttl), start.Add(time.Duration(rank)*time.Microsecond), ttl)
		}
		time.Sleep(watchdog.RenewAfter(ttl) + 10*time.Millisecond)
		synctest.Wait()
		calls := b.snapshot()
		require.Len(t, calls, 3, "batches")
		var first []string
		total := 0
		for _, c := range calls {
			assert.LessOrEqual(t, len(c.names), maxBatchLen)
			assert.True(t, slices.IsSorted(c.names), "a batch in the order of its deadlines")
			if c.names[0] == "00000" {
				first = c.names
			}
			total += len(c.names)
		}
		assert.Equal(t, n, total)
		require.Len(t, first, maxBatchLen)
		assert.Equal(t, fmt.Sprintf("%05d", maxBatchLen-1), first[len(first)-1], "the nearest deadlines in one batch")
		assert.Empty(t, e.all())
	})
}
