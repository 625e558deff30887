package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/holdertest"
	"github.com/guardlock/guard/internal/testserver"
)

func TestMain(m *testing.M) {
	holdertest.Main(openHolder)
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}

// quietLogger drops what go-redis logs in the normal course of these tests — every Sentinel
// lookup (one per failover client) and every failed dial to a server a test killed — and logs
// the rest.
type quietLogger struct{}

func (quietLogger) Printf(_ context.Context, format string, v ...any) {
	if strings.HasPrefix(format, "sentinel: ") || strings.Contains(format, "failed to dial") {
		return
	}
	log.Printf(format, v...)
}

// notifyWait bounds how long a test waits for a notification it expects.
const notifyWait = 10 * time.Second

// deployment is a running Redis deployment that tests make clients for.
type deployment struct {
	kind    string   // "single", "cluster" or "sentinel"
	masters []string // the master addresses
	// client returns a new client of the deployment, closed when the test ends.
	client func(t testing.TB) redis.UniversalClient
}

func startSingle(t testing.TB) *deployment {
	r := testserver.StartRedis(t)
	return &deployment{kind: "single", masters: []string{r.Addr},
		client: func(t testing.TB) redis.UniversalClient {
			return closeLater(t, redis.NewClient(&redis.Options{Addr: r.Addr}))
		}}
}

// startSingleRESP2 is startSingle with clients that speak RESP2, where pub/sub messages and
// pongs arrive as plain arrays rather than RESP3 pushes.
func startSingleRESP2(t testing.TB) *deployment {
	r := testserver.StartRedis(t)
	return &deployment{kind: "single", masters: []string{r.Addr},
		client: func(t testing.TB) redis.UniversalClient {
			return closeLater(t, redis.NewClient(&redis.Options{Addr: r.Addr, Protocol: 2}))
		}}
}

func startCluster(t testing.TB) *deployment {
	c := testserver.StartCluster(t)
	return &deployment{kind: "cluster", masters: c.Addrs,
		client: func(t testing.TB) redis.UniversalClient {
			return closeLater(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs}))
		}}
}

func startSentinel(t testing.TB) *deployment {
	s := testserver.StartSentinel(t)
	return &deployment{kind: "sentinel", masters: []string{s.Master.Addr},
		client: func(t testing.TB) redis.UniversalClient {
			return closeLater(t, redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: s.MasterName, SentinelAddrs: []string{s.Addr},
			}))
		}}
}

func closeLater(t testing.TB, c redis.UniversalClient) redis.UniversalClient {
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// counted returns a new client of d with a hook that counts its round trips, and a Store on it.
func (d *deployment) counted(t testing.TB) (*Store, *testserver.RoundTrips) {
	c := d.client(t)
	return New(c), testserver.CountRoundTrips(c)
}

// admin returns a client of d for the test's own looks at the keys.
func (d *deployment) admin(t testing.TB) redis.UniversalClient { return d.client(t) }

// subscribe opens a subscription on s, closed when the test ends, and returns it with the
// channel its release notifications arrive on.
func subscribe(t *testing.T, s *Store) (guard.Subscription, <-chan string) {
	t.Helper()
	got := make(chan string, 16)
	sub, err := s.Subscribe(func(n guard.Notice) { got <- n.Name })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub, got
}

// takeAndRelease takes name on s, queues a waiter, and releases the name: one notification,
// of the hand-over to the waiter, which then releases it without one (nobody waits).
func takeAndRelease(t *testing.T, s *Store, name string) {
	t.Helper()
	_, err := s.Acquire(t.Context(), guard.Request{Name: name, Token: "tok", TTL: time.Minute})
	require.NoError(t, err)
	queueWaiter(t, s, name, "waiter")
	require.NoError(t, s.Release(t.Context(), name, "tok", 0))
	require.NoError(t, s.Release(t.Context(), name, "waiter", 0), "the name was not handed to the waiter")
}

// queueWaiter puts token in name's wait queue: an acquire that will wait, answered busy.
func queueWaiter(t *testing.T, s *Store, name, token string) {
	t.Helper()
	_, err := s.Acquire(t.Context(), guard.Request{Name: name, Token: token, TTL: time.Minute, Wait: true})
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	require.Positive(t, busy.Queued)
}

// expectNotified waits for the next notification on got and checks it names name.
func expectNotified(t *testing.T, got <-chan string, name, why string) {
	t.Helper()
	select {
	case n := <-got:
		require.Equal(t, name, n, why)
	case <-time.After(notifyWait):
		t.Fatalf("no notification for %q: %s", name, why)
	}
}

// uniqueName returns a lock name that no other test uses.
func uniqueName(t testing.TB, suffix string) string {
	return "test:" + t.Name() + ":" + suffix
}

// commandCalls returns how many times the masters of d ran each command since the last
// reset (INFO commandstats), summed over the masters.
func (d *deployment) commandCalls(t testing.TB, cmds ...string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, addr := range d.masters {
		info, err := testserver.RedisInfo(t.Context(), addr, "commandstats")
		require.NoError(t, err)
		for _, c := range cmds {
			var n int
			if v, ok := info["cmdstat_"+c]; ok {
				_, _ = fmt.Sscanf(v, "calls=%d", &n)
			}
			got[c] += n
		}
	}
	return got
}

func (d *deployment) resetStats(t testing.TB) {
	t.Helper()
	d.eachMaster(t, func(c *redis.Client) error { return c.ConfigResetStat(t.Context()).Err() })
}

// flushScripts empties the script cache of masters, or of every master when none is given.
func (d *deployment) flushScripts(t testing.TB, masters ...string) {
	t.Helper()
	if len(masters) == 0 {
		masters = d.masters
	}
	require.NoError(t, testserver.EachNode(masters, func(c *redis.Client) error { return c.ScriptFlush(t.Context()).Err() }))
}

// eachMaster calls f with a client of each master of d.
func (d *deployment) eachMaster(t testing.TB, f func(c *redis.Client) error) {
	t.Helper()
	require.NoError(t, testserver.EachNode(d.masters, f))
}

// deployments are the kinds of Redis the Store is tested on.
var deployments = []struct {
	name  string
	start func(testing.TB) *deployment
}{
	{"Single", startSingle},
	{"Cluster", startCluster},
	{"Sentinel", startSentinel},
	{"SingleRESP2", startSingleRESP2},
}

// TestStore runs the backend tests on a single node, a three-master Cluster and a
// Sentinel-managed master, each in its own subtest that starts its servers.
func TestStore(t *testing.T) {
	for _, dep := range deployments {
		t.Run(dep.name, func(t *testing.T) {
			t.Parallel()
			d := dep.start(t)
			t.Run("Ownership", func(t *testing.T) { testOwnership(t, d) })
			t.Run("Busy", func(t *testing.T) { testBusy(t, d) })
			t.Run("Contention", func(t *testing.T) { testContention(t, d) })
			t.Run("FenceMonotonic", func(t *testing.T) { testFenceMonotonic(t, d) })
			t.Run("Extend", func(t *testing.T) { testExtend(t, d) })
			t.Run("MinHoldKeep", func(t *testing.T) { testMinHoldKeep(t, d) })
			t.Run("RoundTrips", func(t *testing.T) { testRoundTrips(t, d) })
			t.Run("NoScript", func(t *testing.T) { testNoScript(t, d) })
			t.Run("Names", func(t *testing.T) { testNames(t, d) })
			t.Run("Notify", func(t *testing.T) { testNotify(t, d) })
			t.Run("Unwatch", func(t *testing.T) { testUnwatch(t, d) })
			t.Run("WatchContext", func(t *testing.T) { testWatchContext(t, d) })
			t.Run("Resubscribe", func(t *testing.T) { testResubscribe(t, d) })
			t.Run("HealthCheck", func(t *testing.T) { testHealthCheck(t, d) })
			t.Run("Batch", func(t *testing.T) { testBatch(t, d) })
		})
	}
}

// sameSlot returns lock names that share one Cluster slot (the hash tag is tag), so that
// their notifications come from one node, in order.
func sameSlot(tag string, names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = tag + "}" + n
	}
	return out
}

// pttl returns the remaining lifetime of key in milliseconds: -1 without expiry, -2 if missing.
func pttl(t testing.TB, c redis.UniversalClient, key string) int64 {
	t.Helper()
	n, err := c.Do(t.Context(), "PTTL", key).Int64()
	require.NoError(t, err)
	return n
}

func testOwnership(t *testing.T, d *deployment) {
	ctx := t.Context()
	a, _ := d.counted(t)
	b, _ := d.counted(t)
	adm := d.admin(t)
	name := uniqueName(t, "x")

	fenceA, err := a.Acquire(ctx, guard.Request{Name: name, Token: "token-a", TTL: time.Minute})
	require.NoError(t, err)
	assert.NotZero(t, fenceA)

	_, err = b.Acquire(ctx, guard.Request{Name: name, Token: "token-b", TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired)

	// B can neither extend nor release A's lock, and trying leaves it as it was.
	errs := b.Extend(ctx, []guard.Lease{{Name: name, Token: "token-b", TTL: time.Hour}})
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], guard.ErrNotHeld)
	require.ErrorIs(t, b.Release(ctx, name, "token-b", 0), guard.ErrNotHeld)
	require.ErrorIs(t, b.Release(ctx, name, "token-b", time.Second), guard.ErrNotHeld)
	owner, err := adm.HGet(ctx, a.lockKey(name), "token").Result()
	require.NoError(t, err)
	assert.Equal(t, "token-a", owner)
	left := pttl(t, adm, a.lockKey(name))
	assert.Greater(t, left, int64(50_000), "B's extend must not touch A's lease")
	assert.LessOrEqual(t, left, int64(60_000))

	require.NoError(t, a.Release(ctx, name, "token-a", 0))
	assert.Equal(t, int64(-2), pttl(t, adm, a.lockKey(name)), "release deletes the lock key")
	require.ErrorIs(t, a.Release(ctx, name, "token-a", 0), guard.ErrNotHeld, "second release")

	fenceB, err := b.Acquire(ctx, guard.Request{Name: name, Token: "token-b", TTL: time.Minute})
	require.NoError(t, err)
	assert.Greater(t, fenceB, fenceA)
	require.NoError(t, b.Release(ctx, name, "token-b", 0))
}

func testBusy(t *testing.T, d *deployment) {
	ctx := t.Context()
	a, _ := d.counted(t)
	b, _ := d.counted(t)
	adm := d.admin(t)
	name := uniqueName(t, "x")

	_, err := a.Acquire(ctx, guard.Request{Name: name, Token: "token-a", TTL: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Release(context.Background(), name, "token-a", 0) })

	_, err = b.Acquire(ctx, guard.Request{Name: name, Token: "token-b", TTL: time.Minute})
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	assert.ErrorIs(t, err, guard.ErrNotAcquired)
	assert.NotErrorIs(t, err, guard.ErrNotHeld)
	assert.Equal(t, name, busy.Name)
	assert.Greater(t, busy.Remaining, 5*time.Second)
	assert.LessOrEqual(t, busy.Remaining, 10*time.Second)

	// A key without expiry (written by something else) is busy with an unknown remainder.
	other := uniqueName(t, "forever")
	require.NoError(t, adm.HSet(ctx, b.lockKey(other), "token", "someone").Err())
	t.Cleanup(func() { adm.Del(context.Background(), b.lockKey(other)) })
	_, err = b.Acquire(ctx, guard.Request{Name: other, Token: "token-b", TTL: time.Minute})
	require.ErrorAs(t, err, &busy)
	assert.Zero(t, busy.Remaining)
}

// testContention has many clients try to take one name at the same instant, round after
// round: exactly one wins each round, with a fence above the last round's.
func testContention(t *testing.T, d *deployment) {
	const clients, rounds = 6, 15
	stores := make([]*Store, clients)
	for i := range stores {
		stores[i], _ = d.counted(t)
	}
	name := uniqueName(t, "x")
	var last uint64
	for r := range rounds {
		start := make(chan struct{})
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex // protects winners, fences and failures
			winners []string
			fences  []uint64
			fails   []error
		)
		for i, s := range stores {
			wg.Go(func() {
				tok := fmt.Sprintf("r%d-c%d", r, i)
				<-start
				f, err := s.Acquire(t.Context(), guard.Request{Name: name, Token: tok, TTL: time.Minute})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					winners, fences = append(winners, tok), append(fences, f)
				case !errors.Is(err, guard.ErrNotAcquired):
					fails = append(fails, err)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Empty(t, fails)
		require.Len(t, winners, 1, "round %d", r)
		require.Greater(t, fences[0], last, "round %d", r)
		last = fences[0]
		require.NoError(t, stores[0].Release(t.Context(), name, winners[0], 0))
	}
}

func testFenceMonotonic(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, _ := d.counted(t)
	adm := d.admin(t)
	name := uniqueName(t, "x")
	key := s.lockKey(name)

	var last uint64
	for i := range 6 {
		tok := fmt.Sprint("token-", i)
		f, err := s.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Minute})
		require.NoError(t, err)
		require.Greater(t, f, last, "acquisition %d", i)
		last = f
		if i%2 == 0 {
			require.NoError(t, s.Release(ctx, name, tok, 0))
		} else {
			// The lock vanishes without a release, as when its lease runs out.
			require.NoError(t, adm.Del(ctx, key).Err())
		}
	}
	left := pttl(t, adm, key+fenceSuffix)
	assert.Greater(t, left, int64(time.Minute/time.Millisecond), "the fence key outlives the lease")
	assert.LessOrEqual(t, left, int64((time.Minute+fenceRetention)/time.Millisecond), "the fence key outlives the lease by fenceRetention")
	got, err := adm.Get(ctx, key+fenceSuffix).Result()
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(last), got, "release keeps the fence")

	// Without the fence key — it expired, or the server lost its data — the server's clock
	// still puts the next fence above the last.
	require.NoError(t, adm.Del(ctx, key+fenceSuffix).Err())
	f, err := s.Acquire(ctx, guard.Request{Name: name, Token: "after-loss", TTL: time.Minute})
	require.NoError(t, err)
	assert.Greater(t, f, last, "the fence went backwards without its counter")
	require.NoError(t, s.Release(ctx, name, "after-loss", 0))

	// Fences are exact beyond 2^53, where a Lua number would round.
	require.NoError(t, adm.Set(ctx, key+fenceSuffix, "9007199254740993", 0).Err())
	f, err = s.Acquire(ctx, guard.Request{Name: name, Token: "big", TTL: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, uint64(9007199254740994), f)
	require.NoError(t, s.Release(ctx, name, "big", 0))
}

func testExtend(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, rt := d.counted(t)
	adm := d.admin(t)
	held, other, gone := uniqueName(t, "held"), uniqueName(t, "other"), uniqueName(t, "gone")
	for _, n := range []string{held, other} {
		_, err := s.Acquire(ctx, guard.Request{Name: n, Token: "token-" + n, TTL: time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Release(context.Background(), n, "token-"+n, 0) })
	}

	errs := s.Extend(ctx, []guard.Lease{
		{Name: held, Token: "token-" + held, TTL: time.Minute},
		{Name: other, Token: "not-the-owner", TTL: time.Minute},
		{Name: gone, Token: "token-" + gone, TTL: time.Minute},
		{Name: held, Token: "token-" + held, TTL: 0},
	})
	require.Len(t, errs, 4)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], guard.ErrNotHeld, "held by another token")
	assert.ErrorIs(t, errs[2], guard.ErrNotHeld, "free")
	assert.Error(t, errs[3], "a lease that is not positive")
	assert.NotErrorIs(t, errs[3], guard.ErrNotHeld)

	assert.Greater(t, pttl(t, adm, s.lockKey(held)), int64(50_000), "extended")
	assert.LessOrEqual(t, pttl(t, adm, s.lockKey(other)), int64(1000), "not extended")
	assert.Equal(t, int64(-2), pttl(t, adm, s.lockKey(gone)), "extend must not create a lock")

	before := rt.Load()
	assert.Empty(t, s.Extend(ctx, nil))
	assert.Equal(t, before, rt.Load(), "an empty batch costs nothing")
}

func testMinHoldKeep(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, _ := d.counted(t)
	b, _ := d.counted(t)
	adm := d.admin(t)
	names := sameSlot(uniqueName(t, ""), "kept", "freed")
	kept, freed := names[0], names[1]
	sub, got := subscribe(t, b)
	for _, n := range names {
		_, err := s.Acquire(ctx, guard.Request{Name: n, Token: "token", TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, sub.Watch(ctx, n))
		queueWaiter(t, s, n, "waiter") // releases are announced to waiters
	}

	require.NoError(t, s.Release(ctx, kept, "token", 3*time.Second))
	left := pttl(t, adm, s.lockKey(kept))
	assert.Greater(t, left, int64(0))
	assert.LessOrEqual(t, left, int64(3000), "the lease is shortened to keep")
	owner, err := adm.HGet(ctx, s.lockKey(kept), "token").Result()
	require.NoError(t, err)
	assert.Empty(t, owner, "a kept lock has no owner: no renewal of the old token can match")
	_, err = b.Acquire(ctx, guard.Request{Name: kept, Token: "token-b", TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired, "kept locked for the rest of the window")
	_, err = s.Acquire(ctx, guard.Request{Name: kept, Token: "token", TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired, "the old owner's retry must not take a kept lock back")
	errs := s.Extend(ctx, []guard.Lease{{Name: kept, Token: "token", TTL: time.Minute}})
	require.ErrorIs(t, errs[0], guard.ErrNotHeld, "a late renewal must not extend a kept lock")
	assert.LessOrEqual(t, pttl(t, adm, s.lockKey(kept)), int64(3000), "the late renewal shortened or lengthened the window")

	// A keep is announced, so that waiters learn when the window ends; then the release.
	expectNotified(t, got, kept, "a release with keep")
	require.NoError(t, s.Release(ctx, freed, "token", 0))
	expectNotified(t, got, freed, "a release")
}

// mastersOf returns how many masters hold the lock keys of names.
func (d *deployment) mastersOf(t testing.TB, s *Store, names []string) int {
	t.Helper()
	cc, ok := d.admin(t).(*redis.ClusterClient)
	if !ok {
		return 1
	}
	nodes := map[string]bool{}
	for _, n := range names {
		m, err := cc.MasterForKey(t.Context(), s.lockKey(n))
		require.NoError(t, err)
		nodes[m.Options().Addr] = true
	}
	return len(nodes)
}

func testRoundTrips(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, rt := d.counted(t)
	other, _ := d.counted(t)
	trips := func(f func()) int64 {
		before := rt.Load()
		f()
		return rt.Load() - before
	}
	name := uniqueName(t, "x")
	// Load the scripts and open connections first.
	_, err := s.Acquire(ctx, guard.Request{Name: name, Token: "warm", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "warm", TTL: time.Minute}})[0])
	require.NoError(t, s.Release(ctx, name, "warm", 0))

	assert.Equal(t, int64(1), trips(func() {
		_, err := s.Acquire(ctx, guard.Request{Name: name, Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
	}), "acquire")
	assert.Equal(t, int64(1), trips(func() {
		_, err := s.Acquire(ctx, guard.Request{Name: name, Token: "tok2", TTL: time.Minute})
		require.ErrorIs(t, err, guard.ErrNotAcquired)
	}), "busy acquire")
	assert.Equal(t, int64(1), trips(func() {
		require.NoError(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "tok", TTL: time.Minute}})[0])
	}), "extend")
	assert.Equal(t, int64(1), trips(func() { require.NoError(t, s.Release(ctx, name, "tok", time.Second)) }),
		"release with keep")
	_, err = other.Acquire(ctx, guard.Request{Name: name, Token: "tok2", TTL: time.Minute}) // make sure keep left it locked
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	freed := uniqueName(t, "freed")
	_, err = s.Acquire(ctx, guard.Request{Name: freed, Token: "tok", TTL: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, int64(1), trips(func() { require.NoError(t, s.Release(ctx, freed, "tok", 0)) }), "release")

	// A batch of leases spread over the Cluster's slots: one pipeline, one round trip per node.
	const n = 24
	leases := make([]guard.Lease, n)
	names := make([]string, n)
	for i := range leases {
		names[i] = uniqueName(t, fmt.Sprint(i))
		_, err := s.Acquire(ctx, guard.Request{Name: names[i], Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
		leases[i] = guard.Lease{Name: names[i], Token: "tok", TTL: time.Minute}
		t.Cleanup(func() { _ = s.Release(context.Background(), names[i], "tok", 0) })
	}
	nodes := d.mastersOf(t, s, names)
	if d.kind == "cluster" {
		require.Equal(t, 3, nodes, "the batch should reach every master")
	}
	d.resetStats(t)
	calls := rt.Calls()
	got := trips(func() {
		for i, err := range s.Extend(ctx, leases) {
			require.NoError(t, err, i)
		}
	})
	assert.Equal(t, int64(nodes), got, "batched extend: round trips")
	assert.Equal(t, int64(1), rt.Calls()-calls, "batched extend: one Pipelined call")
	stats := d.commandCalls(t, "evalsha", "eval")
	scripts := 1 // one extend.lua renews the whole batch…
	if d.kind == "cluster" {
		slots := map[uint16]bool{} // …or one per Cluster slot
		for _, name := range names {
			slots[keySlot(s.lockKey(name))] = true
		}
		scripts = len(slots)
	}
	assert.Equal(t, scripts, stats["evalsha"], "one EVALSHA per slot")
	assert.Zero(t, stats["eval"])
	t.Logf("%s: batched extend of %d leases: %d round trips, %d client call(s)", d.kind, n, got, rt.Calls()-calls)
}

func testNoScript(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, rt := d.counted(t)
	trips := func(f func()) int64 {
		before := rt.Load()
		f()
		return rt.Load() - before
	}
	names := []string{uniqueName(t, "a"), uniqueName(t, "b"), uniqueName(t, "c"), uniqueName(t, "d")}

	d.flushScripts(t)
	assert.Equal(t, int64(2), trips(func() {
		_, err := s.Acquire(ctx, guard.Request{Name: names[0], Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
	}), "acquire after SCRIPT FLUSH: EVALSHA, then EVAL")
	assert.Equal(t, int64(1), trips(func() {
		_, err := s.Acquire(ctx, guard.Request{Name: names[0], Token: "tok2", TTL: time.Minute})
		require.ErrorIs(t, err, guard.ErrNotAcquired)
	}), "EVAL cached the script again")
	for _, n := range names[1:] {
		_, err := s.Acquire(ctx, guard.Request{Name: n, Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
	}

	d.flushScripts(t)
	leases := make([]guard.Lease, len(names))
	for i, n := range names {
		leases[i] = guard.Lease{Name: n, Token: "tok", TTL: time.Minute}
	}
	leases = append(leases, guard.Lease{Name: uniqueName(t, "free"), Token: "tok", TTL: time.Minute})
	nodes := d.mastersOf(t, s, names)
	assert.Equal(t, int64(2*nodes), trips(func() {
		errs := s.Extend(ctx, leases)
		for i := range names {
			require.NoError(t, errs[i], i)
		}
		require.ErrorIs(t, errs[len(names)], guard.ErrNotHeld)
	}), "extend after SCRIPT FLUSH: the pipeline, then the NOSCRIPT ones again with EVAL")

	d.flushScripts(t)
	assert.Equal(t, int64(2), trips(func() { require.NoError(t, s.Release(ctx, names[0], "tok", 0)) }),
		"release after SCRIPT FLUSH")
	for _, n := range names[1:] {
		require.NoError(t, s.Release(ctx, n, "tok", 0))
	}

	// List after a SCRIPT FLUSH on every master but the first one it scans (in a Cluster; the
	// only one otherwise): a page whose locks lie on several masters gets NOSCRIPT for some
	// of them only.
	listed := make([]string, 30)
	for i := range listed {
		listed[i] = uniqueName(t, fmt.Sprintf("list%02d", i))
		_, err := s.Acquire(ctx, guard.Request{Name: listed[i], Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
	}
	require.Equal(t, len(d.masters), d.mastersOf(t, s, listed), "the names must lie on every master")
	prefix := uniqueName(t, "list")
	_, _, err := s.List(ctx, prefix, "", len(listed)) // caches inspect.lua on every master
	require.NoError(t, err)
	masters := slices.Sorted(slices.Values(d.masters)) // List scans them in address order
	if len(masters) > 1 {
		masters = masters[1:]
	}
	d.flushScripts(t, masters...)
	page, next, err := s.List(ctx, prefix, "", len(listed))
	require.NoError(t, err, "list after SCRIPT FLUSH on some masters")
	assert.Len(t, page, len(listed))
	assert.Empty(t, next)
}

// testNames takes names with Cluster hash-tag braces, control bytes and the longest length:
// each lock's keys stay in one slot, no two names share keys, and notifications carry the
// exact name.
func testNames(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, _ := d.counted(t)
	adm := d.admin(t)
	sub, got := subscribe(t, s)

	names := []string{
		"}", "}x", "}}", "a}b", "{x}", "{}", "{", "x{", "}{", "{{}}", "a:fence",
		"with space", "tab\tnew\nline", "ünïcödé", "\x01\x7f", strings.Repeat("n", guard.MaxNameLen),
	}
	keys := map[string]string{}
	done := map[string]bool{} // names tested so far
	for _, name := range names {
		require.NoError(t, guard.CheckName(name))
		k := s.lockKey(name)
		require.NotContains(t, keys, k, "%q and %q share a key", keys[k], name)
		keys[k] = name
		keys[k+fenceSuffix] = name

		if cc, ok := adm.(*redis.ClusterClient); ok {
			lock, err := cc.ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			fence, err := cc.ClusterKeySlot(ctx, k+fenceSuffix).Result()
			require.NoError(t, err)
			require.Equal(t, lock, fence, "%q: lock and fence keys in different slots", name)
		}

		f1, err := s.Acquire(ctx, guard.Request{Name: name, Token: "tok", TTL: time.Minute})
		require.NoError(t, err, "%q", name)
		require.NoError(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "tok", TTL: time.Minute}})[0], "%q", name)
		require.NoError(t, sub.Watch(ctx, name), "%q", name)
		queueWaiter(t, s, name, "waiter")
		require.NoError(t, s.Release(ctx, name, "tok", 0), "%q", name)
		require.NoError(t, s.Release(ctx, name, "waiter", 0), "%q was not handed to the waiter", name)
		for n := ""; n != name; {
			select {
			case n = <-got:
				// The second release of an earlier name may still be reported: Unwatch
				// does not wait for the server.
				require.True(t, n == name || done[n], "notified of %q", n)
			case <-time.After(notifyWait):
				t.Fatalf("%q: no notification", name)
			}
		}
		done[name] = true
		sub.Unwatch(name)
		f2, err := s.Acquire(ctx, guard.Request{Name: name, Token: "tok", TTL: time.Minute})
		require.NoError(t, err, "%q", name)
		require.Greater(t, f2, f1)
		require.NoError(t, s.Release(ctx, name, "tok", 0))
	}
}

func testNotify(t *testing.T, d *deployment) {
	ctx := t.Context()
	holder, _ := d.counted(t)
	name := uniqueName(t, "x")
	// Two subscribers, as two Guards in two processes would have.
	var got [2]chan string
	for i := range got {
		got[i] = make(chan string, 16)
		w, _ := d.counted(t)
		sub, err := w.Subscribe(func(n guard.Notice) { got[i] <- n.Name })
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, sub.Close()) })
		require.NoError(t, sub.Watch(ctx, name))
	}
	takeAndRelease(t, holder, name)
	for i := range got {
		select {
		case n := <-got[i]:
			assert.Equal(t, name, n, "subscriber %d", i)
		case <-time.After(notifyWait):
			t.Fatalf("subscriber %d: no notification", i)
		}
	}
}

func testUnwatch(t *testing.T, d *deployment) {
	ctx := t.Context()
	holder, _ := d.counted(t)
	w, _ := d.counted(t)
	got := make(chan string, 16)
	sub, err := w.Subscribe(func(n guard.Notice) { got <- n.Name })
	require.NoError(t, err)
	names := sameSlot(uniqueName(t, ""), "a", "b")
	a, b := names[0], names[1]

	require.NoError(t, sub.Watch(ctx, a))
	require.NoError(t, sub.Watch(ctx, a))
	require.NoError(t, sub.Watch(ctx, b))
	sub.Unwatch("never watched")
	sub.Unwatch(a)
	takeAndRelease(t, holder, a)
	expectNotified(t, got, a, "a watched name") // one Watch of a is left
	sub.Unwatch(a)
	// Unwatch does not wait for the server; the test does, before it releases a again.
	require.Eventually(t, func() bool { return d.numsub(t, w.channel(a)) == 0 }, notifyWait, 5*time.Millisecond)
	takeAndRelease(t, holder, a)
	takeAndRelease(t, holder, b)
	expectNotified(t, got, b, "a watched name") // nothing for a came before it

	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close(), "a second Close")
	require.ErrorIs(t, sub.Watch(ctx, a), ErrSubscriptionClosed)
	sub.Unwatch(b) // harmless after Close
}

func testWatchContext(t *testing.T, d *deployment) {
	w, _ := d.counted(t)
	sub, err := w.Subscribe(func(guard.Notice) {})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = sub.Watch(ctx, uniqueName(t, "x"))
	require.ErrorIs(t, err, context.Canceled)
	inner := sub.(*subscription)
	inner.subMu.Lock()
	defer inner.subMu.Unlock()
	assert.Empty(t, inner.refs, "a failed Watch is not counted")
}

// numsub returns how many connections subscribe to ch on d's masters.
func (d *deployment) numsub(t testing.TB, ch string) (n int64) {
	t.Helper()
	d.eachMaster(t, func(c *redis.Client) error {
		m, err := c.PubSubNumSub(context.Background(), ch).Result()
		n += m[ch]
		return err
	})
	return n
}

// testResubscribe has the server drop the subscription's connection: go-redis reconnects and
// subscribes again, and notifications flow as before.
func testResubscribe(t *testing.T, d *deployment) {
	ctx := t.Context()
	holder, _ := d.counted(t)
	w, _ := d.counted(t)
	sub, got := subscribe(t, w)
	name := uniqueName(t, "x")
	require.NoError(t, sub.Watch(ctx, name))

	ch := w.channel(name)
	subscribers := func() int64 { return d.numsub(t, ch) }
	require.Equal(t, int64(1), subscribers())
	d.eachMaster(t, func(c *redis.Client) error { return c.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err() })
	require.Eventually(t, func() bool { return subscribers() == 1 }, notifyWait, 10*time.Millisecond,
		"go-redis did not subscribe again")

	takeAndRelease(t, holder, name)
	expectNotified(t, got, name, "after the reconnect")
}

// pubsubClients returns the CLIENT LIST lines of the connections in pub/sub mode on d's
// masters, but for the Sentinel's own.
func (d *deployment) pubsubClients(t testing.TB) []string {
	var lines []string
	d.eachMaster(t, func(c *redis.Client) error {
		out, err := c.ClientList(context.Background()).Result()
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.Contains(l, " flags=P ") && !strings.Contains(l, " name=sentinel-") {
				lines = append(lines, l)
			}
		}
		return err
	})
	return lines
}

// clientField returns the value of field in a CLIENT LIST line.
func clientField(line, field string) string {
	for _, kv := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(kv, field+"="); ok {
			return v
		}
	}
	return ""
}

// testHealthCheck shortens the subscription's health check: a silent connection is pinged and
// kept, and a server that stops answering (CLIENT PAUSE) gets a new connection, on which
// notifications flow again.
func testHealthCheck(t *testing.T, d *deployment) {
	ctx := t.Context()
	holder, _ := d.counted(t)
	w, _ := d.counted(t)
	w.idleCheck, w.pongTimeout = 20*time.Millisecond, 200*time.Millisecond
	sub, got := subscribe(t, w)
	name := uniqueName(t, "x")
	require.NoError(t, sub.Watch(ctx, name))

	clients := d.pubsubClients(t)
	require.Len(t, clients, 1)
	id := clientField(clients[0], "id")
	d.resetStats(t)
	require.Eventually(t, func() bool { return d.commandCalls(t, "ping")["ping"] >= 3 },
		notifyWait, 10*time.Millisecond, "the silent connection was not pinged")
	assert.Equal(t, id, clientField(d.pubsubClients(t)[0], "id"), "a live connection was replaced")

	d.eachMaster(t, func(c *redis.Client) error { return c.Do(ctx, "CLIENT", "PAUSE", "1000", "ALL").Err() })
	require.Eventually(t, func() bool {
		c := d.pubsubClients(t)
		return len(c) == 1 && clientField(c[0], "id") != id && clientField(c[0], "sub") == "1"
	}, notifyWait, 10*time.Millisecond, "no new connection after the server stopped answering")

	takeAndRelease(t, holder, name)
	expectNotified(t, got, name, "on the new connection")
}

// TestServerDown kills the server under a Store: every call fails with a backend error that
// is neither busy nor not-held, and a Subscription still closes promptly.
func TestServerDown(t *testing.T) {
	r := testserver.StartRedis(t)
	c := closeLater(t, redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1}))
	s := New(c)
	ctx := t.Context()
	name := uniqueName(t, "x")
	_, err := s.Acquire(ctx, guard.Request{Name: name, Token: "tok", TTL: time.Minute})
	require.NoError(t, err)
	sub, err := s.Subscribe(func(guard.Notice) {})
	require.NoError(t, err)
	require.NoError(t, sub.Watch(ctx, name))

	r.Kill()
	_, err = s.Acquire(ctx, guard.Request{Name: name, Token: "tok2", TTL: time.Minute})
	require.Error(t, err)
	assert.NotErrorIs(t, err, guard.ErrNotAcquired)
	errs := s.Extend(ctx, []guard.Lease{{Name: name, Token: "tok", TTL: time.Minute}})
	require.Error(t, errs[0])
	assert.NotErrorIs(t, errs[0], guard.ErrNotHeld)
	err = s.Release(ctx, name, "tok", 0)
	require.Error(t, err)
	assert.NotErrorIs(t, err, guard.ErrNotHeld)
	assert.NotErrorIs(t, err, guard.ErrNotAcquired)

	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.Error(t, sub.Watch(wctx, uniqueName(t, "y")))

	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs with the server down")
	}
}

func TestNew(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = c.Close() })

	tests := []struct {
		name  string
		build func()
	}{
		{"nil client", func() { New(nil) }},
		{"open brace in prefix", func() { New(c, WithPrefix("app{")) }},
		{"close brace in prefix", func() { New(c, WithPrefix("}app")) }},
		{"negative pipelines", func() { New(c, WithPipelines(-1)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				msg := fmt.Sprint(recover())
				assert.True(t, strings.HasPrefix(msg, "guard/redisstore: "), "panic %q", msg)
			}()
			tt.build()
			t.Fatal("no panic")
		})
	}

	assert.Equal(t, "guard:{n}", New(c).lockKey("n"))
	assert.Equal(t, "app:{n}", New(c, WithPrefix("app:")).lockKey("n"))
	assert.Equal(t, "{n}", New(c, WithPrefix("")).lockKey("n"))
}

func TestKeys(t *testing.T) {
	s := New(closeLater(t, redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}))) // never dialled
	tests := []struct{ name, key string }{
		{"plain", "guard:{plain}"},
		{"a}b", "guard:{a}b}"},
		{"{x}", "guard:{{x}}"},
		{"}x", "guard:{\x00}x}"},
		{"}", "guard:{\x00}}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.key, s.lockKey(tt.name))
			assert.Equal(t, tt.key+":fence", s.lockKey(tt.name)+fenceSuffix)
			name, ok := s.nameOf(s.channel(tt.name))
			assert.True(t, ok)
			assert.Equal(t, tt.name, name)
		})
	}
	for _, ch := range []string{"other:{x}:released", "guard:{x}", "guard:{}:released", "guard:x}:released"} {
		_, ok := s.nameOf(ch)
		assert.False(t, ok, ch)
	}
}
