package lease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard/watchdog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeBackend records renewal batches and answers them as told. Time is synctest's fake clock,
// so every figure below is exact.
type fakeBackend struct {
	mu      sync.Mutex // protects calls and answer
	calls   []call
	answer  func(r Request) (Result, error)
	blocked bool // never answer: wait for ctx
}

type call struct {
	at    time.Time
	names []string
}

func (f *fakeBackend) renew(ctx context.Context, batch []Request) ([]Result, []error) {
	f.mu.Lock()
	c := call{at: time.Now()}
	for _, r := range batch {
		c.names = append(c.names, r.Name)
	}
	f.calls = append(f.calls, c)
	blocked, answer := f.blocked, f.answer
	f.mu.Unlock()
	res := make([]Result, len(batch))
	errs := make([]error, len(batch))
	if blocked {
		<-ctx.Done()
		for i := range batch {
			res[i], errs[i] = Failed, ctx.Err()
		}
		return res, errs
	}
	for i, r := range batch {
		res[i] = Renewed
		if answer != nil {
			res[i], errs[i] = answer(r)
		}
	}
	return res, errs
}

func (f *fakeBackend) snapshot() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// ends collects the Ended calls of the leases it makes.
type ends struct {
	mu    sync.Mutex // protects got and renew
	got   []end
	renew map[*Lease]time.Duration
}

type end struct {
	name   string
	at     time.Time
	reason EndReason
	err    error
}

// lease returns a lease that ends calls record: a watchdog lease renewed to ttl, or a fixed
// lease for ttl 0.
func (e *ends) lease(name string, ttl time.Duration) *Lease {
	l := &Lease{Name: name, Token: "t-" + name, Owner: &owner{ended: func(r EndReason, err error) {
		e.mu.Lock()
		e.got = append(e.got, end{name, time.Now(), r, err})
		e.mu.Unlock()
	}}}
	e.mu.Lock()
	if e.renew == nil {
		e.renew = make(map[*Lease]time.Duration)
	}
	e.renew[l] = ttl
	e.mu.Unlock()
	return l
}

// add grants l a lease of granted, set by a request sent at start.
func (e *ends) add(s *Scheduler, l *Lease, start time.Time, granted time.Duration) {
	e.mu.Lock()
	renew := e.renew[l]
	e.mu.Unlock()
	g := Grant{Start: start, HeldAt: start, Granted: granted, Renew: renew}
	if renew == 0 {
		g.Fixed = granted
	}
	s.Add(l, g)
}

// owner is an Owner made of optional functions.
type owner struct {
	renewed func(time.Time)
	failed  func(error)
	ended   func(EndReason, error)
}

func (o *owner) Renewed(d time.Time) {
	if o.renewed != nil {
		o.renewed(d)
	}
}

func (o *owner) RenewFailed(err error) {
	if o.failed != nil {
		o.failed(err)
	}
}

func (o *owner) Ended(r EndReason, err error) { o.ended(r, err) }

func (e *ends) all() []end {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]end(nil), e.got...)
}

// renewed is an Extend's request that the backend confirms.
func renewed(context.Context, time.Duration) (Result, error) { return Renewed, nil }

func TestRenewsEveryThirdOfTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second
		f := &fakeBackend{}
		s := New(f.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		e.add(s, e.lease("a", ttl), start, ttl)

		time.Sleep(100*time.Second + time.Millisecond)
		calls := f.snapshot()
		require.Len(t, calls, 10)
		for i, c := range calls {
			assert.Equal(t, time.Duration(i+1)*ttl/3, c.at.Sub(start), "renewal %d", i)
		}
		assert.Empty(t, e.all())
	})
}

func TestBatchesLeasesThatAreDueSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second
		f := &fakeBackend{}
		s := New(f.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		e.add(s, e.lease("a", ttl), start, ttl)
		time.Sleep(2 * time.Second)
		e.add(s, e.lease("b", ttl), time.Now(), ttl)
		time.Sleep(2 * time.Second)
		e.add(s, e.lease("c", ttl), time.Now(), ttl)
		time.Sleep(7 * time.Second) // t = 11 s

		calls := f.snapshot()
		require.Len(t, calls, 1, "leases due within TTL/6 of each other share one call")
		assert.Equal(t, 10*time.Second, calls[0].at.Sub(start))
		assert.ElementsMatch(t, []string{"a", "b", "c"}, calls[0].names)
	})
}

func TestEndsAtDeadlineWhenBackendNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second
		f := &fakeBackend{blocked: true}
		s := New(f.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		l := e.lease("a", ttl)
		e.add(s, l, start, ttl)
		assert.Equal(t, start.Add(ttl-watchdog.Drift(ttl)), s.Deadline(l))

		time.Sleep(ttl)
		got := e.all()
		require.Len(t, got, 1)
		assert.Equal(t, Expired, got[0].reason)
		assert.Equal(t, ttl-watchdog.Drift(ttl), got[0].at.Sub(start), "ended exactly at start + TTL - drift")
		assert.Equal(t, 0, s.Len())
	})
}

func TestEndsAtOnceWhenNotHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		f := &fakeBackend{answer: func(Request) (Result, error) { return NotHeld, nil }}
		s := New(f.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		e.add(s, e.lease("a", ttl), start, ttl)
		time.Sleep(ttl)
		got := e.all()
		require.Len(t, got, 1)
		assert.Equal(t, Lost, got[0].reason)
		assert.Equal(t, ttl/3, got[0].at.Sub(start), "lost at the first renewal")
	})
}

func TestRetriesTransientFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		boom := errors.New("connection refused")
		var n atomic.Int32
		f := &fakeBackend{answer: func(Request) (Result, error) {
			if n.Add(1) <= 3 {
				return Failed, boom
			}
			return Renewed, nil
		}}
		s := New(f.renew, nil)
		defer s.Close()
		var e ends
		var failures, renewals atomic.Int32
		l := e.lease("a", ttl)
		l.Owner.(*owner).failed = func(error) { failures.Add(1) }
		l.Owner.(*owner).renewed = func(time.Time) { renewals.Add(1) }
		start := time.Now()
		e.add(s, l, start, ttl)
		time.Sleep(ttl/3 + 3*ttl/10 + time.Millisecond)

		calls := f.snapshot()
		require.Len(t, calls, 4)
		for i := 1; i < 4; i++ {
			assert.Equal(t, ttl/10, calls[i].at.Sub(calls[i-1].at), "retry %d comes a tenth of the TTL later", i)
		}
		assert.EqualValues(t, 3, failures.Load())
		require.EqualValues(t, 1, renewals.Load())
		assert.Equal(t, start.Add(ttl/3+3*ttl/10).Add(ttl-watchdog.Drift(ttl)), s.Deadline(l))
		assert.Empty(t, e.all())
	})
}

func TestLastFailureIsReportedAtExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = time.Second
		boom := errors.New("i/o timeout")
		f := &fakeBackend{answer: func(Request) (Result, error) { return Failed, boom }}
		s := New(f.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		e.add(s, e.lease("a", ttl), start, ttl)
		time.Sleep(2 * ttl)
		got := e.all()
		require.Len(t, got, 1)
		assert.Equal(t, Expired, got[0].reason)
		assert.ErrorIs(t, got[0].err, boom)
		assert.Equal(t, ttl-watchdog.Drift(ttl), got[0].at.Sub(start))
	})
}

func TestFixedLeaseIsOnlyWatched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 5 * time.Second
		f := &fakeBackend{}
		s := New(f.renew, nil)
		defer s.Close()
		var e ends
		start := time.Now()
		l := e.lease("a", 0)
		e.add(s, l, start, lease)
		time.Sleep(2 * time.Second)
		res, err := s.Extend(t.Context(), l, lease, renewed)
		require.NoError(t, err, "extend by hand")
		require.Equal(t, Renewed, res)
		time.Sleep(10 * time.Second)
		assert.Empty(t, f.snapshot(), "a fixed lease is never renewed")
		got := e.all()
		require.Len(t, got, 1)
		assert.Equal(t, Expired, got[0].reason)
		assert.Equal(t, 2*time.Second+lease-watchdog.Drift(lease), got[0].at.Sub(start))
		_, err = s.Extend(t.Context(), l, lease, renewed)
		assert.ErrorIs(t, err, ErrEnded, "an ended lease cannot be extended")
	})
}

func TestRemoveStopsCallbacks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = time.Second
		f := &fakeBackend{}
		s := New(f.renew, nil)
		defer s.Close()
		var e ends
		var renewed atomic.Int32
		l := e.lease("a", ttl)
		l.Owner.(*owner).renewed = func(time.Time) { renewed.Add(1) }
		e.add(s, l, time.Now(), ttl)
		time.Sleep(ttl/3 + time.Millisecond)
		require.EqualValues(t, 1, renewed.Load())
		s.Release(l)
		time.Sleep(5 * ttl)
		assert.EqualValues(t, 1, renewed.Load())
		assert.Empty(t, e.all())
		assert.Len(t, f.snapshot(), 1)
	})
}

func TestCloseWaitsForRenewalInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second
		f := &fakeBackend{blocked: true}
		s := New(f.renew, nil)
		var e ends
		e.add(s, e.lease("a", ttl), time.Now(), ttl)
		time.Sleep(ttl/3 + time.Second)
		require.Len(t, f.snapshot(), 1, "a renewal is in flight")
		s.Close() // must cancel and wait for it; goleak and synctest check nothing is left
		assert.Empty(t, e.all(), "closing ends leases without callbacks")
	})
}
