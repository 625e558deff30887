package mongostore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/holdertest"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/mongostore"
)

func TestMain(m *testing.M) {
	holdertest.Main(openHolder)
	goleak.VerifyTestMain(m)
}

const collName = "locks"

// commands counts the commands a client sends, by name: each is one round trip.
type commands struct {
	total atomic.Int64
	mu    sync.Mutex // protects names and docs
	names []string
	docs  []bson.Raw
}

func (c *commands) started(_ context.Context, e *event.CommandStartedEvent) {
	c.total.Add(1)
	c.mu.Lock()
	c.names = append(c.names, e.CommandName)
	c.docs = append(c.docs, e.Command)
	c.mu.Unlock()
}

// since returns the names of the commands sent after the first n.
func (c *commands) since(n int64) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.names[n:]...)
}

// client is one service instance: its own driver client, collection and Store.
type client struct {
	store *mongostore.Store
	coll  *mongo.Collection // the same collection, for looking behind the store's back
	cmds  *commands
}

// newClient connects a new client to srv and returns a Store on it, clock already measured,
// so that every later operation is exactly its own commands.
func newClient(tb testing.TB, srv *testserver.Mongo, opts ...mongostore.Option) *client {
	tb.Helper()
	return newClientOn(tb, srv, collName, opts...)
}

// newClientOn is newClient on the collection called coll.
func newClientOn(tb testing.TB, srv *testserver.Mongo, coll string, opts ...mongostore.Option) *client {
	tb.Helper()
	cmds := &commands{}
	mc, err := mongo.Connect(options.Client().ApplyURI(srv.URI).
		SetServerSelectionTimeout(2 * time.Second).
		SetMonitor(&event.CommandMonitor{Started: cmds.started}))
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = mc.Disconnect(context.Background()) })
	c := mc.Database(srv.Database).Collection(coll)
	s := mongostore.New(c, opts...)
	require.NoError(tb, s.SyncClock(tb.Context()))
	return &client{store: s, coll: c, cmds: cmds}
}

// count runs f and returns the names of the commands it sent.
func (c *client) count(f func()) []string {
	n := c.cmds.total.Load()
	f()
	return c.cmds.since(n)
}

type lockDoc struct {
	Owner    string    `bson:"owner"`
	Fence    int64     `bson:"fence"`
	Epoch    int64     `bson:"epoch"`
	Expires  time.Time `bson:"expires"`
	Acquired time.Time `bson:"acquired"`
	Instance string    `bson:"instance"`
	Label    string    `bson:"label"`
	Value    string    `bson:"value"`
}

func (c *client) doc(t *testing.T, name string) lockDoc {
	t.Helper()
	var d lockDoc
	require.NoError(t, c.coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: name}}).Decode(&d))
	return d
}

// expire ends name's lease now, behind its holder's back, as if its time had run out.
func (c *client) expire(t *testing.T, name string) {
	t.Helper()
	res, err := c.coll.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: name}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires", Value: time.Now().Add(-time.Second)}}}})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.MatchedCount)
}

func TestRoundTrips(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()
	names := []string{"rt-1", "rt-2", "rt-3"}

	for _, name := range names {
		cmds := a.count(func() {
			_, err := a.store.Acquire(ctx, guard.Request{Name: name, Token: "token-" + name, TTL: time.Minute})
			require.NoError(t, err)
		})
		assert.Equal(t, []string{"findAndModify"}, cmds, "acquire")
	}
	cmds := b.count(func() {
		_, err := b.store.Acquire(ctx, guard.Request{Name: names[0], Token: "other", TTL: time.Minute})
		require.ErrorIs(t, err, guard.ErrNotAcquired)
	})
	assert.Equal(t, []string{"findAndModify"}, cmds, "busy acquire")

	leases := make([]guard.Lease, len(names))
	for i, name := range names {
		leases[i] = guard.Lease{Name: name, Token: "token-" + name, TTL: time.Minute}
	}
	cmds = a.count(func() {
		for _, err := range a.store.Extend(ctx, leases) {
			require.NoError(t, err)
		}
	})
	assert.Equal(t, []string{"update"}, cmds, "extend of %d leases", len(leases))

	for _, name := range names {
		cmds = a.count(func() { require.NoError(t, a.store.Release(ctx, name, "token-"+name, 0)) })
		assert.Equal(t, []string{"update"}, cmds, "release")
	}
	cmds = a.count(func() { assert.Empty(t, a.store.Extend(ctx, nil)) })
	assert.Empty(t, cmds, "extend of no leases")
}

func TestFirstOperationMeasuresClock(t *testing.T) {
	srv := testserver.StartMongo(t)
	c := newClient(t, srv)
	// A store that never measured the clock: its first operation does, then no more.
	s := mongostore.New(c.coll)
	off, unc := s.ClockOffset()
	assert.Zero(t, off)
	assert.Zero(t, unc)
	cmds := c.count(func() {
		_, err := s.Acquire(t.Context(), guard.Request{Name: "first", Token: "t", TTL: time.Minute})
		require.NoError(t, err)
	})
	assert.Equal(t, []string{"hello", "hello", "findAndModify"}, cmds)
	cmds = c.count(func() { require.NoError(t, s.Release(t.Context(), "first", "t", 0)) })
	assert.Equal(t, []string{"update"}, cmds)

	off, unc = s.ClockOffset()
	t.Logf("clock offset %v ± %v", off, unc)
	assert.Positive(t, unc)
	if !srv.External { // FerretDB runs on this host, with this clock
		assert.Less(t, off.Abs(), 50*time.Millisecond)
	}
}

func TestClockRefresh(t *testing.T) {
	srv := testserver.StartMongo(t)
	c := newClient(t, srv, mongostore.WithClockRefresh(time.Millisecond))
	<-time.After(2 * time.Millisecond) // let the measurement go stale
	cmds := c.count(func() {
		_, err := c.store.Acquire(t.Context(), guard.Request{Name: "refresh", Token: "t", TTL: time.Minute})
		require.NoError(t, err)
	})
	assert.Equal(t, []string{"hello", "findAndModify"}, cmds)
}

func TestAcquire(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()

	before := time.Now()
	fence, err := a.store.Acquire(ctx, guard.Request{Name: "job", Token: "token-a", TTL: time.Minute,
		Instance: "instance-a", Label: "job:{id}", Value: "leader-a"})
	require.NoError(t, err)

	d := a.doc(t, "job")
	assert.Equal(t, "token-a", d.Owner)
	assert.EqualValues(t, 1, d.Fence)
	assert.Equal(t, uint64(d.Epoch)+1, fence, "the fence is the epoch plus the count")
	assert.WithinDuration(t, before, time.UnixMicro(d.Epoch), time.Second, "the epoch is the server's time")
	assert.Equal(t, "instance-a", d.Instance)
	assert.Equal(t, "job:{id}", d.Label)
	assert.Equal(t, "leader-a", d.Value, "the value the holder publishes (an election's)")
	info, err := b.store.Inspect(ctx, "job")
	require.NoError(t, err)
	assert.Equal(t, "leader-a", info.Value)
	assert.Equal(t, 1, info.Holders)
	assert.WithinDuration(t, before, d.Acquired, time.Second)
	assert.WithinDuration(t, before.Add(time.Minute), d.Expires, time.Second)

	t.Run("HeldIsBusy", func(t *testing.T) {
		_, err := b.store.Acquire(ctx, guard.Request{Name: "job", Token: "token-b", TTL: time.Minute})
		var busy *guard.BusyError
		require.ErrorAs(t, err, &busy)
		assert.ErrorIs(t, err, guard.ErrNotAcquired)
		assert.Equal(t, "job", busy.Name)
		assert.Zero(t, busy.Remaining, "Remaining is not read: it would cost a round trip")
		assert.Equal(t, "token-a", a.doc(t, "job").Owner)
	})
	t.Run("SameTokenRetries", func(t *testing.T) {
		again, err := a.store.Acquire(ctx, guard.Request{Name: "job", Token: "token-a", TTL: time.Minute})
		require.NoError(t, err, "a retried request must find its own lock")
		assert.Greater(t, again, fence)
	})
	t.Run("Canceled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := b.store.Acquire(cctx, guard.Request{Name: "job", Token: "token-b", TTL: time.Minute})
		require.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, guard.ErrNotAcquired)
	})
}

func TestFencesIncrease(t *testing.T) {
	srv := testserver.StartMongo(t)
	clients := []*client{newClient(t, srv), newClient(t, srv)}
	ctx := t.Context()
	var first, last uint64
	for i := range 10 {
		c := clients[i%2]
		token := fmt.Sprintf("token-%d", i)
		fence, err := c.store.Acquire(ctx, guard.Request{Name: "fenced", Token: token, TTL: time.Minute})
		require.NoError(t, err)
		require.Greater(t, fence, last, "acquisition %d", i)
		if i == 0 {
			first = fence
		}
		last = fence
		switch i % 3 {
		case 0:
			require.NoError(t, c.store.Release(ctx, "fenced", token, 0))
		case 1:
			c.expire(t, "fenced") // the holder crashed and its lease ran out
		case 2:
			require.NoError(t, c.store.Release(ctx, "fenced", token, time.Millisecond))
			c.expire(t, "fenced")
		}
	}
	assert.Equal(t, first+9, last, "one more per acquisition")
	assert.EqualValues(t, 10, clients[0].doc(t, "fenced").Fence, "release keeps the count")
}

func TestRelease(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()

	t.Run("Frees", func(t *testing.T) {
		first, err := a.store.Acquire(ctx, guard.Request{Name: "free", Token: "token-a", TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, a.store.Release(ctx, "free", "token-a", 0))
		d := a.doc(t, "free")
		assert.Empty(t, d.Owner)
		assert.EqualValues(t, 1, d.Fence)
		fence, err := b.store.Acquire(ctx, guard.Request{Name: "free", Token: "token-b", TTL: time.Minute})
		require.NoError(t, err)
		assert.Equal(t, first+1, fence)
	})
	t.Run("Twice", func(t *testing.T) {
		_, err := a.store.Acquire(ctx, guard.Request{Name: "twice", Token: "token-a", TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, a.store.Release(ctx, "twice", "token-a", 0))
		require.ErrorIs(t, a.store.Release(ctx, "twice", "token-a", 0), guard.ErrNotHeld)
	})
	t.Run("NotOurs", func(t *testing.T) {
		_, err := a.store.Acquire(ctx, guard.Request{Name: "theirs", Token: "token-a", TTL: time.Minute})
		require.NoError(t, err)
		require.ErrorIs(t, b.store.Release(ctx, "theirs", "token-b", 0), guard.ErrNotHeld)
		require.ErrorIs(t, b.store.Release(ctx, "nobody", "token-b", 0), guard.ErrNotHeld)
		assert.Equal(t, "token-a", a.doc(t, "theirs").Owner)
	})
	t.Run("Keep", func(t *testing.T) {
		first, err := a.store.Acquire(ctx, guard.Request{Name: "keep", Token: "token-a", TTL: time.Minute})
		require.NoError(t, err)
		before := time.Now()
		require.NoError(t, a.store.Release(ctx, "keep", "token-a", 300*time.Millisecond))
		d := a.doc(t, "keep")
		assert.Equal(t, "(kept)", d.Owner, "keep holds the name under an owner no token matches")
		errs := a.store.Extend(ctx, []guard.Lease{{Name: "keep", Token: "token-a", TTL: time.Minute}})
		require.ErrorIs(t, errs[0], guard.ErrNotHeld, "a late renewal must not extend a kept lock")
		assert.WithinDuration(t, before.Add(300*time.Millisecond), d.Expires, 100*time.Millisecond)
		_, err = b.store.Acquire(ctx, guard.Request{Name: "keep", Token: "token-b", TTL: time.Minute})
		require.ErrorIs(t, err, guard.ErrNotAcquired, "taken inside the kept window")
		// Once the window is over, the name is free without anyone releasing it again.
		fence := eventually(t, b.store, "keep", "token-b", 5*time.Second)
		assert.Equal(t, first+1, fence)
		assert.GreaterOrEqual(t, time.Since(before), 300*time.Millisecond-clockSlack(b))
	})
}

// clockSlack is how early, by the local clock, a store may see a lease end: the uncertainty
// of its server-clock estimate, plus the millisecond of BSON dates.
func clockSlack(c *client) time.Duration {
	_, unc := c.store.ClockOffset()
	return unc + time.Millisecond
}

// eventually tries to take name every few milliseconds until it succeeds or limit passes, and
// returns the fence. It only retries on busy.
func eventually(t *testing.T, s *mongostore.Store, name, token string, limit time.Duration) uint64 {
	t.Helper()
	deadline := time.After(limit)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		fence, err := s.Acquire(t.Context(), guard.Request{Name: name, Token: token, TTL: time.Minute})
		if err == nil {
			return fence
		}
		require.ErrorIs(t, err, guard.ErrNotAcquired)
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s still busy after %v", name, limit)
		}
	}
}

// TestStaleHolder lets a lease run out, lets another owner take the name, and shows that the
// first owner can neither release nor extend the new owner's lock.
func TestStaleHolder(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b, c := newClient(t, srv), newClient(t, srv), newClient(t, srv)
	ctx := t.Context()

	first, err := a.store.Acquire(ctx, guard.Request{Name: "stale", Token: "token-a", TTL: time.Minute})
	require.NoError(t, err)
	a.expire(t, "stale")

	require.ErrorIs(t, a.store.Release(ctx, "stale", "token-a", 0), guard.ErrNotHeld,
		"release of an expired lease")
	errs := a.store.Extend(ctx, []guard.Lease{{Name: "stale", Token: "token-a", TTL: time.Minute}})
	require.ErrorIs(t, errs[0], guard.ErrNotHeld, "extend of an expired lease")

	fence, err := b.store.Acquire(ctx, guard.Request{Name: "stale", Token: "token-b", TTL: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, first+1, fence)

	require.ErrorIs(t, a.store.Release(ctx, "stale", "token-a", 0), guard.ErrNotHeld)
	require.ErrorIs(t, a.store.Release(ctx, "stale", "token-a", time.Minute), guard.ErrNotHeld)
	errs = a.store.Extend(ctx, []guard.Lease{{Name: "stale", Token: "token-a", TTL: time.Minute}})
	require.ErrorIs(t, errs[0], guard.ErrNotHeld)

	assert.Equal(t, "token-b", b.doc(t, "stale").Owner)
	_, err = c.store.Acquire(ctx, guard.Request{Name: "stale", Token: "token-c", TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired, "the new holder's lock is still held")
}

// TestReleaseRacesAcquire starts, in each round, the old holder's release of its expired lock
// and a new owner's acquisition at the same moment: whichever the server runs first, the new
// owner ends up holding the name.
func TestReleaseRacesAcquire(t *testing.T) {
	srv := testserver.StartMongo(t)
	old, next, probe := newClient(t, srv), newClient(t, srv), newClient(t, srv)
	ctx := t.Context()
	for round := range 30 {
		name := fmt.Sprintf("race-%d", round)
		_, err := old.store.Acquire(ctx, guard.Request{Name: name, Token: "old", TTL: time.Minute})
		require.NoError(t, err)
		old.expire(t, name)

		var (
			wg         sync.WaitGroup
			start      = make(chan struct{})
			releaseErr error
			acquireErr error
		)
		wg.Go(func() { <-start; releaseErr = old.store.Release(ctx, name, "old", 0) })
		wg.Go(func() {
			<-start
			_, acquireErr = next.store.Acquire(ctx, guard.Request{Name: name, Token: "next", TTL: time.Minute})
		})
		close(start)
		wg.Wait()

		require.ErrorIs(t, releaseErr, guard.ErrNotHeld, "round %d: release of an expired lease", round)
		require.NoError(t, acquireErr, "round %d", round)
		assert.Equal(t, "next", probe.doc(t, name).Owner, "round %d", round)
		_, err = probe.store.Acquire(ctx, guard.Request{Name: name, Token: "probe", TTL: time.Minute})
		require.ErrorIs(t, err, guard.ErrNotAcquired, "round %d: the new holder's lock was freed", round)
	}
}

// TestCrashedHolder takes a lock, loses its client without releasing (a crashed process), and
// shows that another store takes the name right after the lease ends: nothing deletes the
// document (no TTL index), the expiry in it is enough.
func TestCrashedHolder(t *testing.T) {
	srv := testserver.StartMongo(t)
	crashed, next := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()
	const ttl = 400 * time.Millisecond

	start := time.Now()
	first, err := crashed.store.Acquire(ctx, guard.Request{Name: "crash", Token: "crashed", TTL: ttl})
	require.NoError(t, err)
	_, err = next.store.Acquire(ctx, guard.Request{Name: "crash", Token: "next", TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired)

	fence := eventually(t, next.store, "crash", "next", 5*time.Second)
	took := time.Since(start)
	t.Logf("taken over %v after the crashed holder's acquisition (lease %v)", took, ttl)
	assert.Equal(t, first+1, fence)
	assert.GreaterOrEqual(t, took, ttl-clockSlack(next), "taken before the lease ended")
	// MongoDB's TTL monitor runs once a minute: a takeover this soon owes it nothing.
	assert.Less(t, took, ttl+2*time.Second, "not taken soon after the lease ended")
}

// TestRacers lets racers stores, each with its own client, try to take one expired name at
// the same moment, round after round: exactly one wins each round, with the next fence.
func TestRacers(t *testing.T) {
	srv := testserver.StartMongo(t)
	const (
		racers = 8
		rounds = 30
	)
	clients := make([]*client, racers)
	for i := range clients {
		clients[i] = newClient(t, srv)
	}
	ctx := t.Context()
	name := "contended"
	first, err := clients[0].store.Acquire(ctx, guard.Request{Name: name, Token: "first", TTL: time.Minute})
	require.NoError(t, err)
	for round := range rounds {
		clients[0].expire(t, name)
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			mu      sync.Mutex // protects winners and fences
			winners []string
			fences  []uint64
		)
		for i, c := range clients {
			token := fmt.Sprintf("r%d-%d", round, i)
			wg.Go(func() {
				<-start
				fence, err := c.store.Acquire(ctx, guard.Request{Name: name, Token: token, TTL: time.Minute})
				if err != nil {
					assert.ErrorIs(t, err, guard.ErrNotAcquired)
					return
				}
				mu.Lock()
				winners, fences = append(winners, token), append(fences, fence)
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		require.Len(t, winners, 1, "round %d: winners %v", round, winners)
		assert.Equal(t, first+uint64(round)+1, fences[0], "round %d: fence", round)
		assert.Equal(t, winners[0], clients[0].doc(t, name).Owner)
	}
}

func TestExtend(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()
	take := func(c *client, name, token string) {
		t.Helper()
		_, err := c.store.Acquire(ctx, guard.Request{Name: name, Token: token, TTL: time.Minute})
		require.NoError(t, err)
	}

	t.Run("All", func(t *testing.T) {
		take(a, "all-1", "a1")
		take(a, "all-2", "a2")
		var errs []error
		cmds := a.count(func() {
			errs = a.store.Extend(ctx, []guard.Lease{
				{Name: "all-1", Token: "a1", TTL: 2 * time.Minute},
				{Name: "all-2", Token: "a2", TTL: 3 * time.Minute},
			})
		})
		assert.Equal(t, []string{"update"}, cmds)
		require.Equal(t, []error{nil, nil}, errs)
		assert.WithinDuration(t, time.Now().Add(2*time.Minute), a.doc(t, "all-1").Expires, time.Second)
		assert.WithinDuration(t, time.Now().Add(3*time.Minute), a.doc(t, "all-2").Expires, time.Second)
	})

	t.Run("None", func(t *testing.T) {
		take(b, "none-1", "b1")
		var errs []error
		cmds := a.count(func() {
			errs = a.store.Extend(ctx, []guard.Lease{
				{Name: "none-1", Token: "a1", TTL: time.Minute},
				{Name: "none-missing", Token: "a2", TTL: time.Minute},
			})
		})
		assert.Equal(t, []string{"update"}, cmds, "nothing matched: no need to look")
		require.Len(t, errs, 2)
		for _, err := range errs {
			assert.ErrorIs(t, err, guard.ErrNotHeld)
		}
	})

	t.Run("Mixed", func(t *testing.T) {
		take(a, "mixed-held", "a")
		take(a, "mixed-stolen", "a")
		take(a, "mixed-expired", "a")
		take(a, "mixed-released", "a")
		take(a, "mixed-held-2", "a")
		// Behind a's back: another owner takes one, one runs out, one is released.
		a.expire(t, "mixed-stolen")
		take(b, "mixed-stolen", "b")
		a.expire(t, "mixed-expired")
		require.NoError(t, a.store.Release(ctx, "mixed-released", "a", 0))
		stolenExpiry := a.doc(t, "mixed-stolen").Expires

		leases := []guard.Lease{
			{Name: "mixed-held", Token: "a", TTL: 5 * time.Minute},
			{Name: "mixed-stolen", Token: "a", TTL: 5 * time.Minute},
			{Name: "mixed-expired", Token: "a", TTL: 5 * time.Minute},
			{Name: "mixed-missing", Token: "a", TTL: 5 * time.Minute},
			{Name: "mixed-released", Token: "a", TTL: 5 * time.Minute},
			{Name: "mixed-held-2", Token: "a", TTL: 5 * time.Minute},
		}
		var errs []error
		cmds := a.count(func() { errs = a.store.Extend(ctx, leases) })
		assert.Equal(t, []string{"update", "find"}, cmds, "one batch, one read to tell the results apart")
		require.Len(t, errs, len(leases))
		for i, l := range leases {
			held := l.Name == "mixed-held" || l.Name == "mixed-held-2"
			if held {
				assert.NoError(t, errs[i], l.Name)
				assert.WithinDuration(t, time.Now().Add(5*time.Minute), a.doc(t, l.Name).Expires, time.Second)
			} else {
				assert.ErrorIs(t, errs[i], guard.ErrNotHeld, l.Name)
				assert.NotErrorIs(t, errs[i], guard.ErrNotAcquired, l.Name)
			}
		}
		assert.Equal(t, "b", a.doc(t, "mixed-stolen").Owner)
		assert.Equal(t, stolenExpiry, a.doc(t, "mixed-stolen").Expires, "the new owner's lease is untouched")
	})
}

// TestServerDown shows that a dead server gives wrapped driver errors: never busy, never "not
// held", which would tell the Guard something false about the lock.
func TestServerDown(t *testing.T) {
	srv := testserver.StartFerretDB(t)
	c := newClient(t, srv)
	ctx := t.Context()
	_, err := c.store.Acquire(ctx, guard.Request{Name: "down", Token: "t", TTL: time.Minute})
	require.NoError(t, err)
	srv.Kill()

	_, err = c.store.Acquire(ctx, guard.Request{Name: "down-2", Token: "t", TTL: time.Minute})
	require.Error(t, err)
	assert.NotErrorIs(t, err, guard.ErrNotAcquired)
	t.Logf("acquire: %v", err)

	for _, err := range c.store.Extend(ctx, []guard.Lease{{Name: "down", Token: "t", TTL: time.Minute}}) {
		require.Error(t, err)
		assert.NotErrorIs(t, err, guard.ErrNotHeld)
	}
	err = c.store.Release(ctx, "down", "t", 0)
	require.Error(t, err)
	assert.NotErrorIs(t, err, guard.ErrNotHeld)

	var serverErr mongo.ServerError
	assert.False(t, errors.As(err, &serverErr), "a network error, not a server answer: %v", err)
}

func TestWriteConcern(t *testing.T) {
	srv := testserver.StartMongo(t)
	tests := []struct {
		name string
		opts []mongostore.Option
		want string // the w field, as extended JSON
	}{
		{"DefaultMajority", nil, `"majority"`},
		{"W1", []mongostore.Option{mongostore.WithWriteConcern(writeconcern.W1())}, `{"$numberInt":"1"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, srv, tt.opts...)
			ctx := t.Context()
			name := "wc-" + tt.name
			n := c.cmds.total.Load()
			_, err := c.store.Acquire(ctx, guard.Request{Name: name, Token: "t", TTL: time.Minute})
			require.NoError(t, err)
			c.store.Extend(ctx, []guard.Lease{{Name: name, Token: "t", TTL: time.Minute}})
			require.NoError(t, c.store.Release(ctx, name, "t", 0))

			c.cmds.mu.Lock()
			docs := c.cmds.docs[n:]
			c.cmds.mu.Unlock()
			require.Len(t, docs, 3)
			for _, d := range docs {
				w, err := d.LookupErr("writeConcern", "w")
				require.NoError(t, err, "%s has no write concern", d)
				assert.Equal(t, tt.want, w.String())
			}
		})
	}
}

func TestNewPanics(t *testing.T) {
	srv := testserver.StartMongo(t)
	coll := newClient(t, srv).coll
	tests := []struct {
		name string
		f    func()
	}{
		{"NilCollection", func() { mongostore.New(nil) }},
		{"NilWriteConcern", func() { mongostore.New(coll, mongostore.WithWriteConcern(nil)) }},
		{"Unacknowledged", func() { mongostore.New(coll, mongostore.WithWriteConcern(writeconcern.Unacknowledged())) }},
		{"ZeroClockRefresh", func() { mongostore.New(coll, mongostore.WithClockRefresh(0)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				require.NotNil(t, r)
				assert.Contains(t, fmt.Sprint(r), "guard/mongostore: ")
			}()
			tt.f()
		})
	}
}
