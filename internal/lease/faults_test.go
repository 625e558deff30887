package lease

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/watchdog"
)

// stuckBackend renews every lease at once, except that the requests it is told to hold get
// no answer: they wait for their context, as a request whose reply was lost does — or, with
// slow set, for that long whatever their context says, as a client that ignores context
// deadlines (go-redis by default) waits for a reply that is on its way.
type stuckBackend struct {
	mu    sync.Mutex // protects calls and seen
	calls []call
	// hold reports whether this request (the n-th, from 0, that carries lease name) hangs.
	hold func(name string, n int) bool
	seen map[string]int
	slow time.Duration
}

func (b *stuckBackend) renew(ctx context.Context, batch []Request) ([]Result, []error) {
	b.mu.Lock()
	c := call{at: time.Now()}
	hang := false
	for _, r := range batch {
		c.names = append(c.names, r.Name)
		if b.hold(r.Name, b.seen[r.Name]) {
			hang = true
		}
		b.seen[r.Name]++
	}
	b.calls = append(b.calls, c)
	b.mu.Unlock()
	res := make([]Result, len(batch))
	errs := make([]error, len(batch))
	switch {
	case hang && b.slow > 0:
		time.Sleep(b.slow) // the reply is on its way; renewed, but late
	case hang:
		<-ctx.Done()
		for i := range batch {
			res[i], errs[i] = Failed, ctx.Err()
		}
	}
	return res, errs
}

func (b *stuckBackend) snapshot() []call {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

func newStuck(hold func(name string, n int) bool) *stuckBackend {
	return &stuckBackend{hold: hold, seen: make(map[string]int)}
}

// TestUnansweredRenewalIsSentAgain: the first renewal of a lease never gets its reply (the
// issue's "one renewal round trip delayed past the TTL"). The scheduler must send it again
// after TTL/6 instead of waiting for the deadline, and the lease must live on.
func TestUnansweredRenewalIsSentAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 600 * time.Millisecond
		b := newStuck(func(_ string, n int) bool { return n == 0 })
		s := New(b.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		e.add(s, e.lease("a", ttl), start, ttl)

		time.Sleep(5 * ttl)
		assert.Empty(t, e.all(), "a lease ended because one renewal went unanswered")
		calls := b.snapshot()
		require.GreaterOrEqual(t, len(calls), 2)
		assert.Equal(t, ttl/3, calls[0].at.Sub(start), "first renewal")
		assert.Equal(t, ttl/3+ttl/6, calls[1].at.Sub(start), "sent again after TTL/6")
	})
}

// TestStuckBatchStarvesNoOtherLease: lease a's first renewal takes 700 ms with a TTL of 600 ms
// (the slow reply); lease b, due later, must be renewed in a batch of its own rather
// than wait behind a's — only one batch used to be out at a time, so one slow reply cost
// every lock of the Guard — and a must survive too, by sending its renewal again.
func TestStuckBatchStarvesNoOtherLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 600 * time.Millisecond
		b := newStuck(func(name string, n int) bool { return name == "a" && n == 0 })
		b.slow = 700 * time.Millisecond
		s := New(b.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		e.add(s, e.lease("a", ttl), start, ttl)
		time.Sleep(ttl / 4) // b is due after a's batch has gone out, and outside it
		e.add(s, e.lease("b", ttl), time.Now(), ttl)

		time.Sleep(5 * ttl)
		assert.Empty(t, e.all(), "a lease was lost to one slow reply")
		calls := b.snapshot()
		require.NotEmpty(t, calls)
		assert.Equal(t, []string{"a"}, calls[0].names, "b rode with a's slow renewal")
		assert.Equal(t, ttl/3, calls[0].at.Sub(start))
	})
}

// TestPartitionsAreRenewedApart: the leases on a server whose renewals hang end at their
// deadline, exactly; the leases on another server are renewed all along.
func TestPartitionsAreRenewedApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 600 * time.Millisecond
		slow := map[string]bool{"s1": true, "s2": true}
		b := newStuck(func(name string, _ int) bool { return slow[name] })
		partition := func(name string) string {
			if slow[name] {
				return "slow-node"
			}
			return "fast-node"
		}
		s := New(b.renew, partition)
		defer s.Close()
		var e ends
		start := time.Now()
		for _, n := range []string{"s1", "f1", "s2", "f2"} {
			e.add(s, e.lease(n, ttl), start, ttl)
		}

		time.Sleep(5 * ttl)
		ended := e.all()
		require.Len(t, ended, 2, "%v", ended)
		for _, end := range ended {
			assert.True(t, slow[end.name], "%s lost to the other node's hanging renewals", end.name)
			assert.Equal(t, watchdog.Deadline(start, ttl), end.at, "%s ended at its deadline", end.name)
		}
		for _, c := range b.snapshot() {
			assert.True(t, !slices.Contains(c.names, "s1") || !slices.Contains(c.names, "f1"),
				"one call mixed two partitions: %v", c.names)
		}
	})
}

// TestSuspendedHostEndsLeasesThatRanOut fakes a suspended host: the wall clock jumps ahead
// while the monotonic clock, which stops during a suspension, does not. Leases whose time ran
// out meanwhile must end at once, at the next heartbeat, not when the stopped clock says.
func TestSuspendedHostEndsLeasesThatRanOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second
		b := newStuck(func(string, int) bool { return false })
		s := New(b.renew, nil)
		defer s.Close()
		var away atomic.Int64
		s.mu.Lock()
		s.wallOffset = func() time.Duration { return time.Duration(away.Load()) }
		s.mu.Unlock()
		var e ends
		e.add(s, e.lease("watchdog", ttl), time.Now(), ttl)
		e.add(s, e.lease("fixed", 0), time.Now(), time.Hour) // a LeaseTime lock of an hour

		time.Sleep(2 * time.Second)
		away.Store(int64(40 * time.Minute))
		woke := time.Now()
		time.Sleep(3 * time.Second)

		ended := e.all()
		require.Len(t, ended, 1, "%v", ended)
		assert.Equal(t, "watchdog", ended[0].name, "the 30 s lease ran out during 40 minutes away; the hour did not")
		assert.Equal(t, Suspended, ended[0].reason)
		assert.ErrorIs(t, ended[0].err, watchdog.ErrSuspended)
		assert.LessOrEqual(t, ended[0].at.Sub(woke), maxHeartbeat, "noticed after the next heartbeat")
	})
}

// TestShortSuspensionRenewsAtOnce: a host away for less than what was left of a lease keeps
// the lease, but renews it at once and counts the deadline from before the pause.
func TestShortSuspensionRenewsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second
		b := newStuck(func(string, int) bool { return false })
		s := New(b.renew, nil)
		defer s.Close()
		var away atomic.Int64
		s.mu.Lock()
		s.wallOffset = func() time.Duration { return time.Duration(away.Load()) }
		s.mu.Unlock()
		var e ends
		l := e.lease("a", ttl)
		e.add(s, l, time.Now(), ttl)

		time.Sleep(time.Second)
		before := s.Deadline(l)
		away.Store(int64(5 * time.Second))
		time.Sleep(maxHeartbeat + time.Millisecond)

		assert.Empty(t, e.all())
		calls := b.snapshot()
		require.Len(t, calls, 1, "renewed at once after the suspension")
		assert.Less(t, calls[0].at.Sub(before.Add(-ttl)), ttl/3, "renewed before its usual time")
		assert.True(t, s.Deadline(l).After(before.Add(-5*time.Second)), "the renewal moved the deadline on")
	})
}

// TestClaim: a lock handed over with a short lease claims the rest of its own when a third of
// the short one has passed — once: a LeaseTime lock is only watched after that — and not at
// all when it is released before then. The claim asks for what is left of the lease the lock
// asked for, counted from its grant, so that it lives no longer than asked.
func TestClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const granted, lease = time.Second, 10 * time.Second
		b := newStuck(func(string, int) bool { return false })
		s := New(b.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		grant := Grant{Start: start, HeldAt: start, Granted: granted, Fixed: lease}
		claimed := e.lease("claimed", 0)
		s.Add(claimed, grant)
		released := e.lease("released", 0)
		s.Add(released, grant)

		time.Sleep(granted / 4)
		s.Release(released)
		time.Sleep(granted)
		calls := b.snapshot()
		require.Len(t, calls, 1, "one claim, for the lock still held")
		assert.Equal(t, []string{"claimed"}, calls[0].names)
		assert.Equal(t, granted/3, calls[0].at.Sub(start))
		assert.Equal(t, watchdog.Deadline(calls[0].at, lease-granted/3), s.Deadline(claimed), "the claimed lease ends when the lease asked for does")

		time.Sleep(2 * lease)
		assert.Len(t, b.snapshot(), 1, "a LeaseTime lock was renewed after its claim")
		ended := e.all()
		require.Len(t, ended, 1)
		assert.Equal(t, Expired, ended[0].reason)
		assert.Equal(t, watchdog.Deadline(calls[0].at, lease-granted/3), ended[0].at)
	})
}

// TestFullBatchesDoNotSpin: with every batch the scheduler may have out hanging, leases that
// are due cannot be sent until one comes back; the loop must sleep until then, not wake at
// once again and again (under synctest, a loop that spins never lets time pass, and this test
// would hang).
func TestFullBatchesDoNotSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 600 * time.Millisecond
		b := newStuck(func(string, int) bool { return true })
		s := New(b.renew, func(name string) string { return name }) // a batch each
		defer s.Close()
		var e ends
		start := time.Now()
		for i := range 2 * maxBatches {
			e.add(s, e.lease(string(rune('a'+i)), ttl), start, ttl)
		}
		time.Sleep(ttl / 2)
		synctest.Wait()
		assert.Len(t, b.snapshot(), maxBatches, "batches out")
		time.Sleep(ttl)
		assert.Len(t, e.all(), 2*maxBatches, "every lease ended at its deadline")
	})
}

// queueBackend answers batches one at a time, in the order they arrive, each after service:
// a server working through a queue, busy but not stuck.
type queueBackend struct {
	service time.Duration
	serve   chan struct{} // holds a token while a batch is served: the queue (a channel, which synctest sees blocked)

	mu     sync.Mutex // protects out and hedges
	out    map[string]int
	hedges []string // a name requested while a request for it was out
}

func (b *queueBackend) renew(ctx context.Context, batch []Request) ([]Result, []error) {
	b.mu.Lock()
	for _, r := range batch {
		if b.out[r.Name] > 0 {
			b.hedges = append(b.hedges, r.Name)
		}
		b.out[r.Name]++
	}
	b.mu.Unlock()
	b.serve <- struct{}{}
	time.Sleep(b.service)
	<-b.serve
	b.mu.Lock()
	for _, r := range batch {
		b.out[r.Name]--
	}
	b.mu.Unlock()
	return make([]Result, len(batch)), make([]error, len(batch)) // all Renewed
}

// TestBusyBackendIsNotHedged: eight leases, each on a server of its own (so each in a batch of
// its own), are due at once; the backend answers one batch every 30 ms, so the last answers
// come 240 ms after they were sent — past the hedge delay (TTL/6 = 100 ms) but well within the
// lease. Answers keep coming meanwhile: the backend is busy, not stuck, and a copy of each
// late request would only make its queue longer (with 100,000 locks on a loaded host, copies
// were half of all requests and most locks were lost). No request may be sent twice, and no
// lease may end.
func TestBusyBackendIsNotHedged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 600 * time.Millisecond
		b := &queueBackend{service: 30 * time.Millisecond, serve: make(chan struct{}, 1), out: make(map[string]int)}
		s := New(b.renew, func(name string) string { return name })
		defer s.Close()
		var e ends
		start := time.Now()
		for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
			e.add(s, e.lease(name, ttl), start, ttl)
		}

		time.Sleep(5 * ttl)
		assert.Empty(t, e.all(), "a lease ended behind a busy backend")
		b.mu.Lock()
		defer b.mu.Unlock()
		assert.Empty(t, b.hedges, "requests sent again while the backend was answering the ones before them")
	})
}

// TestBatchOutlivesItsMostUrgentLease: a lease near its deadline and one with time left go out
// in one batch, whose answer comes after the first lease's deadline but well before the
// second's. The batch must not be cancelled at the first deadline: that failed the whole
// batch — with a Guard that is behind, thousands of leases sent nearest-deadline first — for
// the sake of one lease that ends anyway.
func TestBatchOutlivesItsMostUrgentLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 600 * time.Millisecond
		var first atomic.Pointer[[]string]
		renew := func(ctx context.Context, batch []Request) ([]Result, []error) {
			var names []string
			for _, r := range batch {
				names = append(names, r.Name)
			}
			first.CompareAndSwap(nil, &names)
			res, errs := make([]Result, len(batch)), make([]error, len(batch))
			select {
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				for i := range res {
					res[i], errs[i] = Failed, ctx.Err()
				}
			}
			return res, errs
		}
		s := New(renew, nil)
		defer s.Close()
		start := time.Now()
		var mu sync.Mutex
		var failed []error
		var renewed int
		var endedA, endedB []EndReason
		a := &Lease{Name: "a", Token: "ta", Owner: &owner{ended: func(r EndReason, _ error) { mu.Lock(); endedA = append(endedA, r); mu.Unlock() }}}
		b := &Lease{Name: "b", Token: "tb", Owner: &owner{
			renewed: func(time.Time) { mu.Lock(); renewed++; mu.Unlock() },
			failed:  func(err error) { mu.Lock(); failed = append(failed, err); mu.Unlock() },
			ended:   func(r EndReason, _ error) { mu.Lock(); endedB = append(endedB, r); mu.Unlock() },
		}}
		// a: granted only 250 ms (a hand-over's short lease), due at 83 ms, deadline ≈ 242 ms;
		// b: granted 500 ms, due at 166 ms — within the batch window of a's renewal.
		s.Add(a, Grant{Start: start, HeldAt: start, Granted: 250 * time.Millisecond, Renew: ttl})
		s.Add(b, Grant{Start: start, HeldAt: start, Granted: 500 * time.Millisecond, Renew: ttl})

		time.Sleep(450 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		require.NotNil(t, first.Load())
		require.Equal(t, []string{"a", "b"}, *first.Load(), "a and b went out in one batch")
		assert.Equal(t, []EndReason{Expired}, endedA, "a ran out before the answer came")
		assert.Empty(t, failed, "b's renewal failed with a's deadline")
		assert.Positive(t, renewed, "b renewed by the batch's answer")
		assert.Empty(t, endedB)
	})
}
