package gocronlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/gocronlock"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/memstore"
)

// lease is the watchdog timeout of the electors' Guards: the lease of the leadership lock.
const lease = 2 * time.Second

// election is one instance taking the lead.
type election struct {
	instance int
	fence    uint64
	at       time.Time
	rivals   []int // the other instances whose leadership lock had a live context at that moment
}

// electorFleet is 3 instances, each with its own Guard on a new client of the server, an
// Elector and a gocron scheduler that runs one job every period while the instance leads.
type electorFleet struct {
	log      *guardtest.TickLog
	elected  chan election
	backends []*mortal
	guards   []*guard.Guard
	scheds   []*scheduler

	mu       sync.Mutex // protects electors
	electors []*gocronlock.Elector
}

func startElectorFleet(t *testing.T, open func(*testing.T) guard.Backend) *electorFleet {
	t.Helper()
	name := lockName(t)
	t0 := time.Now().Add(startLead)
	f := &electorFleet{
		log:      guardtest.NewTickLog(t0, period),
		elected:  make(chan election, 100),
		backends: make([]*mortal, instances),
		guards:   make([]*guard.Guard, instances),
		electors: make([]*gocronlock.Elector, instances),
	}
	for i := range instances {
		f.backends[i] = &mortal{Backend: open(t)}
		g := guard.New(f.backends[i], guard.WithWatchdogTimeout(lease))
		f.guards[i] = g
		// A dead instance's Guard cannot release: its Close error is expected.
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		guardtest.WarmUp(t, g)
		e, err := gocronlock.NewElector(g, name, gocronlock.Settle(hold), gocronlock.OnElected(func(l *guard.Lock) {
			ev := election{instance: i, fence: l.Fence(), at: time.Now()}
			f.mu.Lock()
			for j, other := range f.electors {
				if j == i || other == nil {
					continue
				}
				if _, live := other.Leader(); live {
					ev.rivals = append(ev.rivals, j)
				}
			}
			f.mu.Unlock()
			f.elected <- ev
		}))
		require.NoError(t, err)
		f.mu.Lock()
		f.electors[i] = e
		f.mu.Unlock()
		t.Cleanup(func() { _ = e.Close(context.Background()) })

		s := newScheduler(t, gocron.WithDistributedElector(splayedElector{e}))
		var job gocron.Job
		scheduled := func() time.Time {
			next, err := job.NextRun()
			assert.NoError(t, err)
			return next.Add(-period)
		}
		job, err = s.NewJob(gocron.DurationJob(period), gocron.NewTask(e.Func(f.log.Task(i, 2*time.Millisecond, scheduled))),
			gocron.WithName(name),
			gocron.WithStartAt(gocron.WithStartDateTime(t0)),
			gocron.WithEventListeners(gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) {
				// A run that the end of its term cancelled is not a failure; others are.
				if !errors.Is(err, guard.ErrLockLost) && !errors.Is(err, guard.ErrClosed) {
					t.Errorf("instance %d: the job failed: %v", i, err)
				}
			})))
		require.NoError(t, err)
		f.scheds = append(f.scheds, s)
	}
	for _, s := range f.scheds {
		s.Start()
	}
	return f
}

// waitElected returns the next election.
func (f *electorFleet) waitElected(t *testing.T) election {
	t.Helper()
	select {
	case ev := <-f.elected:
		return ev
	case <-time.After(5 * lease):
		t.Fatalf("no instance took the lead within %v", 5*lease)
		return election{}
	}
}

// waitRuns waits until instance has run the job n more times.
func (f *electorFleet) waitRuns(t *testing.T, instance, n int) {
	t.Helper()
	timeout := time.NewTimer(time.Duration(n)*period + 5*lease)
	defer timeout.Stop()
	for n > 0 {
		select {
		case i := <-f.log.Ran:
			if i == instance {
				n--
			}
		case <-timeout.C:
			t.Fatalf("instance %d does not run the job", instance)
		}
	}
}

// Acceptance: the lead passes to another instance within one lease when the leader's Guard is
// closed and when its process dies, two instances never lead with live contexts at once, and
// no tick runs twice.
func TestElectorHandOver(t *testing.T) {
	for _, srv := range guardtest.Servers() {
		t.Run(srv.Name, func(t *testing.T) {
			f := startElectorFleet(t, srv.Start(t))

			first := f.waitElected(t)
			f.waitRuns(t, first.instance, 3)

			closed := time.Now()
			require.NoError(t, f.guards[first.instance].Close(t.Context()))
			second := f.waitElected(t)
			closeHandOver := second.at.Sub(closed)
			f.waitRuns(t, second.instance, 3)

			died := time.Now()
			f.backends[second.instance].die()
			third := f.waitElected(t)
			deathHandOver := third.at.Sub(died)
			f.waitRuns(t, third.instance, 3)
			for _, s := range f.scheds {
				s.shutdown(t)
			}

			t.Logf("lease %v; hand-over after the leader's Guard closed: %v; after its process died: %v",
				lease, closeHandOver.Round(time.Millisecond), deathHandOver.Round(time.Millisecond))
			for _, ev := range []election{first, second, third} {
				assert.Empty(t, ev.rivals, "instance %d took the lead while %v still led", ev.instance, ev.rivals)
			}
			assert.NotEqual(t, first.instance, second.instance)
			assert.NotContains(t, []int{first.instance, second.instance}, third.instance)
			assert.Less(t, first.fence, second.fence)
			assert.Less(t, second.fence, third.fence)
			assert.LessOrEqual(t, closeHandOver, lease, "hand-over after close")
			// A dead leader's lease runs out at most one lease after its death; a waiter takes
			// the lock then, or at its next re-try when the busy answer did not say when.
			assert.LessOrEqual(t, deathHandOver, lease+retryAfterExpiry(t, f.backends[third.instance].Backend),
				"hand-over after death")

			f.log.Log(t)
			assert.Zero(t, f.log.RanTwice(), "a tick ran twice")
			assert.Zero(t, f.log.Overlaps(), "runs overlapped")
		})
	}
}

// retryAfterExpiry returns how long after a lease ends a waiter may take to re-try, at most,
// on backend: a waiter sleeps until the end of the holder's lease when the busy answer carries
// it (plus at most 2% and a round trip), and otherwise re-tries with a back-off of at most a
// second (docs/semantics.md).
func retryAfterExpiry(t *testing.T, backend guard.Backend) time.Duration {
	t.Helper()
	name := lockName(t) + ":probe"
	_, err := backend.Acquire(t.Context(), guard.Request{Name: name, Token: "probe-holder", TTL: lease})
	require.NoError(t, err)
	defer func() { _ = backend.Release(context.Background(), name, "probe-holder", 0) }()
	_, err = backend.Acquire(t.Context(), guard.Request{Name: name, Token: "probe-waiter", TTL: lease})
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	if busy.Remaining > 0 {
		return lease / 10
	}
	return time.Second + lease/10
}

// waitElection returns the lock of the next election reported on ch.
func waitElection(t *testing.T, ch <-chan *guard.Lock) *guard.Lock {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(5 * time.Second):
		t.Fatal("no election")
		return nil
	}
}

// newElector returns an Elector on g that reports its elections on a channel, closed when the
// test ends.
func newElector(t *testing.T, g *guard.Guard, name string, opts ...gocronlock.ElectorOption) (*gocronlock.Elector, <-chan *guard.Lock) {
	t.Helper()
	ch := make(chan *guard.Lock, 10)
	e, err := gocronlock.NewElector(g, name, append(opts, gocronlock.OnElected(func(l *guard.Lock) { ch <- l }))...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.Close(context.Background())) })
	return e, ch
}

// Closing the leader's Elector ends its term — its tasks' contexts end with ErrClosed — and
// hands the lead over; an instance that does not lead runs no task.
func TestElectorClose(t *testing.T) {
	store := memstore.New()
	ga, gb := guard.New(store), guard.New(store)
	defer ga.Close(context.Background())
	defer gb.Close(context.Background())
	name := lockName(t)

	a, electedA := newElector(t, ga, name, gocronlock.Settle(0))
	la := waitElection(t, electedA)
	b, electedB := newElector(t, gb, name, gocronlock.Settle(0))

	require.NoError(t, a.IsLeader(t.Context()))
	l, ok := a.Leader()
	require.True(t, ok)
	assert.Same(t, la, l)
	assert.ErrorIs(t, b.IsLeader(t.Context()), gocronlock.ErrNotLeader)
	_, ok = b.Leader()
	assert.False(t, ok)
	err := b.Func(func(context.Context) error {
		t.Error("a task ran on an instance that does not lead")
		return nil
	})(t.Context())
	assert.ErrorIs(t, err, gocronlock.ErrNotLeader)

	type result struct {
		cause, err error
	}
	running, done := make(chan struct{}), make(chan result, 1)
	go func() {
		var cause error
		err := a.Func(func(ctx context.Context) error {
			close(running)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return cause
		})(t.Context())
		done <- result{cause, err}
	}()
	<-running
	require.NoError(t, a.Close(t.Context()))
	r := <-done
	assert.ErrorIs(t, r.cause, gocronlock.ErrClosed)
	assert.ErrorIs(t, r.err, gocronlock.ErrClosed)
	assert.ErrorIs(t, a.IsLeader(t.Context()), gocronlock.ErrNotLeader)
	assert.ErrorIs(t, context.Cause(la.Context()), gocronlock.ErrClosed)

	lb := waitElection(t, electedB)
	require.NoError(t, b.IsLeader(t.Context()))
	assert.Greater(t, lb.Fence(), la.Fence())
}

// A leader that took over from another settles before it leads; one that took the name from
// nobody, at its first attempt, leads at once.
func TestElectorSettles(t *testing.T) {
	store := memstore.New()
	ga, gb := guard.New(store), guard.New(store)
	defer ga.Close(context.Background())
	defer gb.Close(context.Background())
	name := lockName(t)

	a, electedA := newElector(t, ga, name, gocronlock.Settle(time.Hour))
	waitElection(t, electedA)
	require.NoError(t, a.IsLeader(t.Context()), "the first leader took the name from nobody")

	b, electedB := newElector(t, gb, name, gocronlock.Settle(time.Hour))
	assert.ErrorIs(t, b.IsLeader(t.Context()), gocronlock.ErrNotLeader, "the first attempt found the name held")
	require.NoError(t, a.Close(t.Context()))
	waitElection(t, electedB)
	_, ok := b.Leader()
	assert.True(t, ok, "elected")
	err := b.IsLeader(t.Context())
	assert.ErrorIs(t, err, gocronlock.ErrNotLeader)
	assert.ErrorContains(t, err, "settling for 1h0m0s")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.ErrorIs(t, b.IsLeader(ctx), context.Canceled)
}

// The first IsLeader waits for the first attempt's outcome, up to FirstElectionWait: here a
// backend that does not answer until the test lets it.
func TestElectorFirstElectionWaits(t *testing.T) {
	b := newHeldBack()
	g := guard.New(b)
	defer g.Close(context.Background())
	e, elected := newElector(t, g, lockName(t))
	answered := make(chan error, 1)
	go func() { answered <- e.IsLeader(t.Context()) }()
	select {
	case err := <-answered:
		t.Fatalf("IsLeader answered %v before the first attempt had an outcome", err)
	case <-b.in:
	}
	close(b.letGo)
	require.NoError(t, <-answered)
	waitElection(t, elected)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	stuck := newHeldBack()
	defer close(stuck.letGo)
	g2 := guard.New(stuck)
	defer g2.Close(context.Background())
	e2, err := gocronlock.NewElector(g2, lockName(t))
	require.NoError(t, err)
	defer e2.Close(context.Background())
	assert.ErrorIs(t, e2.IsLeader(ctx), context.Canceled, "a cancelled context ends the wait")
}

// heldBack is a backend whose Acquire waits until letGo is closed.
type heldBack struct {
	guard.Backend
	guard.Inspector // an Elector's election reads who leads
	letGo           chan struct{}
	in              chan struct{} // closed when an Acquire first waits
	inClose         sync.Once
}

func newHeldBack() *heldBack {
	store := memstore.New()
	return &heldBack{Backend: store, Inspector: store, letGo: make(chan struct{}), in: make(chan struct{})}
}

func (h *heldBack) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	h.inClose.Do(func() { close(h.in) })
	select {
	case <-h.letGo:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return h.Backend.Acquire(ctx, r)
}

// Closing the Guard ends the term and the campaign.
func TestElectorGuardClosed(t *testing.T) {
	g := guard.New(memstore.New())
	e, elected := newElector(t, g, lockName(t))
	l := waitElection(t, elected)
	require.NoError(t, g.Close(t.Context()))
	assert.ErrorIs(t, context.Cause(l.Context()), guard.ErrClosed)
	assert.ErrorIs(t, e.IsLeader(t.Context()), gocronlock.ErrNotLeader)
	require.NoError(t, e.Close(t.Context())) // the campaign has ended: Close does not wait
}

func TestNewElectorErrors(t *testing.T) {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	plain := guard.New(struct{ guard.Backend }{memstore.New()})
	defer plain.Close(context.Background())
	for _, c := range []struct {
		name string
		g    *guard.Guard
		lock string
		opts []gocronlock.ElectorOption
		want error
		msg  string
	}{
		{"nil guard", nil, "leader", nil, nil, "nil *guard.Guard"},
		{"empty name", g, "", nil, guard.ErrInvalidName, "empty"},
		{"negative settle", g, "leader", []gocronlock.ElectorOption{gocronlock.Settle(-time.Second)},
			guard.ErrInvalidOption, "Settle(-1s)"},
		{"backend that cannot tell who leads", plain, "leader", nil, guard.ErrUnsupported, "guard.Inspector"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := gocronlock.NewElector(c.g, c.lock, c.opts...)
			assert.Nil(t, e)
			require.Error(t, err)
			if c.want != nil {
				assert.ErrorIs(t, err, c.want)
			}
			assert.ErrorContains(t, err, c.msg)
		})
	}
	e, err := gocronlock.NewElector(g, "leader", nil) // a nil option is ignored
	require.NoError(t, err)
	require.NoError(t, e.Close(t.Context()))
	assert.PanicsWithValue(t, "guard/gocronlock: Elector.Func(nil)", func() { e.Func(nil) })
}

// An Elector's terms are an election's: every instance reads who leads and what it published,
// and observes each hand-over in order, with a higher fence each time.
func TestElectorElection(t *testing.T) {
	store := memstore.New()
	ga, gb := guard.New(store), guard.New(store)
	defer ga.Close(context.Background())
	defer gb.Close(context.Background())
	name := lockName(t)

	a, electedA := newElector(t, ga, name, gocronlock.Settle(0), gocronlock.LeaderValue("10.0.0.1:8080"))
	la := waitElection(t, electedA)
	b, electedB := newElector(t, gb, name, gocronlock.Settle(0), gocronlock.LeaderValue("10.0.0.2:8080"))
	assert.Equal(t, name, b.Election().Name())

	leader, err := b.Election().Leader(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:8080", leader.Value, "b reads what a published")
	assert.Equal(t, la.Fence(), leader.Fence)
	assert.Equal(t, guard.KindTerm, la.Kind())
	require.NoError(t, a.Election().Check())
	require.NoError(t, b.Election().Check(), "not leading is healthy")

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	changes := b.Election().Observe(ctx)
	first := <-changes
	assert.Equal(t, la.Fence(), first.Fence)

	require.NoError(t, a.Close(t.Context()))
	lb := waitElection(t, electedB)
	select {
	case next := <-changes:
		assert.Equal(t, "10.0.0.2:8080", next.Value)
		assert.Equal(t, lb.Fence(), next.Fence)
		assert.Greater(t, next.Fence, first.Fence)
	case <-time.After(5 * time.Second):
		t.Fatal("Observe did not report the new leader")
	}
	leader, err = a.Election().Leader(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:8080", leader.Value, "the closed instance reads the new leader too")
	cancel()
	for range changes { // closed when ctx ends
	}
}
