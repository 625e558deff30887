package pgstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/watchdog"
)

func TestNew(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // no I/O yet
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	assert.PanicsWithValue(t, "guard/pgstore: New: nil pool", func() { New(nil) })
	valid := []struct{ in, table string }{
		{"locks", "locks"},
		{"ops.locks", "ops.locks"},
		{"Ops.Locks", "ops.locks"}, // folded, as SQL folds an unquoted name
		{"_l$1", "_l$1"},
		{strings.Repeat("a", 63), strings.Repeat("a", 63)},
		{`"locks"`, "locks"}, // quoted as it would be folded: the same table
		{`"Locks"`, `"Locks"`},
		{`ops."Job locks"`, `ops."Job locks"`},
		{`"Ops"."a.b"`, `"Ops"."a.b"`},
		{`"say ""hi"""`, `"say ""hi"""`},
		{`"x'; DROP TABLE users; --"`, `"x'; DROP TABLE users; --"`},
		{`"` + strings.Repeat("é", 31) + `"`, `"` + strings.Repeat("é", 31) + `"`},
	}
	for _, tc := range valid {
		t.Run("Valid/"+tc.in[:min(len(tc.in), 16)], func(t *testing.T) {
			assert.Equal(t, tc.table, New(pool, WithTable(tc.in)).Table())
		})
	}
	assert.Equal(t, DefaultTable, New(pool).Table())

	invalid := map[string]string{
		"Empty":        "",
		"Injection":    "locks; DROP TABLE users",
		"Comment":      "locks--",
		"QuoteInside":  `lo"cks`,
		"Unclosed":     `"locks`,
		"AfterQuotes":  `"locks"x`,
		"EmptyQuoted":  `""`,
		"NULQuoted":    "\"lo\x00cks\"",
		"LongQuoted":   `"` + strings.Repeat("é", 32) + `"`,
		"ThreeQuoted":  `"a"."b"."c"`,
		"Space":        "my locks",
		"ThreeParts":   "db.ops.locks",
		"EmptySchema":  ".locks",
		"EmptyTable":   "ops.",
		"LeadingDigit": "1locks",
		"LeadingDolar": "$locks",
		"TooLong":      strings.Repeat("a", 64),
		"NonASCII":     "lócks",
		"Parenthesis":  "locks()",
	}
	for name, in := range invalid {
		t.Run("Invalid/"+name, func(t *testing.T) {
			defer func() {
				r := recover()
				require.NotNil(t, r, "New accepted WithTable(%q)", in)
				assert.True(t, strings.HasPrefix(fmt.Sprint(r), "guard/pgstore: WithTable("), "panic: %v", r)
			}()
			New(pool, WithTable(in))
		})
	}
}

func TestCreateTable(t *testing.T) {
	srv := startServer(t)
	ctx := t.Context()

	t.Run("Idempotent", func(t *testing.T) {
		st, _ := srv.store(t)
		require.NoError(t, st.CreateTable(ctx), "the table exists already")
		require.NoError(t, st.CreateTable(ctx))
	})
	t.Run("Concurrent", func(t *testing.T) {
		table := "guard_concurrent_" + strings.ToLower(rand.Text()[:6])
		t.Cleanup(func() { _, _ = srv.admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
		var wg sync.WaitGroup
		for range 8 {
			st := New(newPool(t, srv.pg.DSN, nil), WithTable(table))
			wg.Go(func() { assert.NoError(t, st.CreateTable(ctx)) })
		}
		wg.Wait()
	})
	t.Run("SchemaQualified", func(t *testing.T) {
		schema := "guard_schema_" + strings.ToLower(rand.Text()[:6])
		_, err := srv.admin.Exec(ctx, "CREATE SCHEMA "+schema)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = srv.admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
		st := New(srv.admin, WithTable(strings.ToUpper(schema)+".Locks"))
		require.NoError(t, st.CreateTable(ctx))
		require.NoError(t, st.CreateTable(ctx))
		fence, err := st.Acquire(ctx, guard.Request{Name: "n", Token: "t", TTL: time.Minute})
		require.NoError(t, err)
		var n int
		require.NoError(t, srv.admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".locks WHERE fence = $1 AND token <> ''", fence).Scan(&n))
		assert.Equal(t, 1, n, "the lock is not in %s.locks", schema)
	})
	t.Run("MissingTable", func(t *testing.T) {
		st := New(srv.admin, WithTable("guard_never_created"))
		_, err := st.Acquire(ctx, guard.Request{Name: "n", Token: "t", TTL: time.Minute})
		require.Error(t, err)
		assert.NotErrorIs(t, err, guard.ErrNotAcquired, "a missing table is a failure, not busy")
	})
}

// TestRace lets racers, each with a pool of its own, take over one name at the same moment,
// round after round: exactly one may win each round. A read-then-write acquisition lets
// several through here.
func TestRace(t *testing.T) {
	const (
		racers = 10
		rounds = 60
	)
	srv := startServer(t)
	stores := make([]*Store, racers)
	for i := range stores {
		stores[i], _ = srv.store(t)
	}
	cases := []struct {
		name string
		seed func(t *testing.T, name string) // leaves the name free before the race
	}{
		{"ExpiredLock", func(t *testing.T, name string) {
			// A holder that died: its lease ran out a moment ago by the database's clock.
			_, err := srv.admin.Exec(t.Context(), "INSERT INTO "+srv.table+
				" (name, token, fence, expires_at, acquired_at) VALUES ($1, 'dead', 7, now() - interval '1 ms', now() - interval '1 s')", name)
			require.NoError(t, err)
		}},
		{"NewName", func(*testing.T, string) {}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "race:" + rand.Text() + ":"
			for round := range rounds {
				name := fmt.Sprintf("%s%d", prefix, round)
				tc.seed(t, name)
				for _, st := range stores { // every racer has a live connection: no dial in the race
					require.NoError(t, st.pool.Ping(t.Context()))
				}
				var (
					start   = make(chan struct{})
					wg      sync.WaitGroup
					mu      sync.Mutex // protects winners
					winners []uint64
				)
				for _, st := range stores {
					wg.Go(func() {
						<-start
						fence, err := st.Acquire(t.Context(), guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute})
						var busy *guard.BusyError
						switch {
						case err == nil:
							mu.Lock()
							winners = append(winners, fence)
							mu.Unlock()
						case errors.As(err, &busy):
						default:
							t.Errorf("round %d: %v", round, err)
						}
					})
				}
				close(start)
				wg.Wait()
				require.Len(t, winners, 1, "round %d: %d winners", round, len(winners))
				assert.Greater(t, winners[0], uint64(7))
			}
			t.Logf("%d rounds of %d racers: one winner each", rounds, racers)
		})
	}
}

// TestBusy checks what a busy answer says: the holder's remaining lease, by the database's
// clock, held and kept for a MinHold window.
func TestBusy(t *testing.T) {
	srv := startServer(t)
	st, _ := srv.store(t)
	ctx := t.Context()
	name := "busy:" + rand.Text()
	tok := rand.Text()
	_, err := st.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Minute})
	require.NoError(t, err)

	var busy *guard.BusyError
	_, err = st.Acquire(ctx, guard.Request{Name: name, Token: rand.Text(), TTL: time.Second})
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, name, busy.Name)
	assert.Greater(t, busy.Remaining, 50*time.Second)
	assert.LessOrEqual(t, busy.Remaining, time.Minute)

	require.NoError(t, st.Release(ctx, name, tok, 20*time.Second))
	_, err = st.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Second})
	require.ErrorAs(t, err, &busy, "the old token took a kept lock")
	assert.Greater(t, busy.Remaining, 10*time.Second, "a kept lock reports the rest of its window")
	assert.LessOrEqual(t, busy.Remaining, 20*time.Second)
	assert.ErrorIs(t, st.Release(ctx, name, tok, 0), guard.ErrNotHeld, "the old token released a kept lock")
	errs := st.Extend(ctx, []guard.Lease{{Name: name, Token: tok, TTL: time.Hour}})
	assert.ErrorIs(t, errs[0], guard.ErrNotHeld, "the old token extended a kept lock")
}

// TestOwnRetry sends one acquisition twice: the second is the same grant, not a new one.
func TestOwnRetry(t *testing.T) {
	srv := startServer(t)
	st, _ := srv.store(t)
	in, ctx := guard.Inspector(st), t.Context()
	r := guard.Request{Name: "retry:" + rand.Text(), Token: rand.Text(), TTL: time.Minute, Instance: "i", Label: "l"}
	first, err := st.Acquire(ctx, r)
	require.NoError(t, err)
	before, err := in.Inspect(ctx, r.Name)
	require.NoError(t, err)
	again, err := st.Acquire(ctx, r)
	require.NoError(t, err)
	after, err := in.Inspect(ctx, r.Name)
	require.NoError(t, err)
	assert.Equal(t, first, again, "a retry counted a new acquisition")
	assert.Equal(t, before.AcquiredAt, after.AcquiredAt)
	assert.GreaterOrEqual(t, after.Remaining, before.Remaining-time.Second, "the retry did not renew the lease")
}

// TestExtendBatch renews several leases in one statement, each answered on its own.
func TestExtendBatch(t *testing.T) {
	srv := startServer(t)
	st, rt := srv.store(t)
	ctx := t.Context()
	held, other, kept := "batch:held:"+rand.Text(), "batch:other:"+rand.Text(), "batch:kept:"+rand.Text()
	tok := rand.Text()
	for _, name := range []string{held, other, kept} {
		_, err := st.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Minute})
		require.NoError(t, err)
	}
	require.NoError(t, st.Release(ctx, kept, tok, time.Minute))
	before := rt.Load()
	errs := st.Extend(ctx, []guard.Lease{
		{Name: held, Token: tok, TTL: time.Hour},
		{Name: other, Token: "not-the-holder", TTL: time.Hour},
		{Name: kept, Token: tok, TTL: time.Hour},
		{Name: "batch:never:" + rand.Text(), Token: tok, TTL: time.Hour},
		{Name: held, Token: tok, TTL: 0},
	})
	assert.EqualValues(t, 1, rt.Load()-before, "round trips of one batch")
	require.Len(t, errs, 5)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], guard.ErrNotHeld)
	assert.ErrorIs(t, errs[2], guard.ErrNotHeld)
	assert.ErrorIs(t, errs[3], guard.ErrNotHeld)
	assert.Error(t, errs[4], "a lease of 0")
	info, err := st.Inspect(ctx, held)
	require.NoError(t, err)
	assert.Greater(t, info.Remaining, 59*time.Minute)
}

// TestReclaim deletes rows free for longer than the idle time, and only those; a reclaimed
// name's next fence is still above its last.
func TestReclaim(t *testing.T) {
	srv := startServer(t)
	st, _ := srv.store(t)
	ctx := t.Context()
	_, err := st.Reclaim(ctx, 59*time.Second)
	require.ErrorIs(t, err, ErrIdleTooShort)

	prefix := "reclaim:" + rand.Text() + ":"
	old, recent, held := prefix+"old", prefix+"recent", prefix+"held"
	var last uint64
	for range 3 {
		tok := rand.Text()
		last, err = st.Acquire(ctx, guard.Request{Name: old, Token: tok, TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, st.Release(ctx, old, tok, 0))
	}
	for _, name := range []string{recent, held} {
		tok := rand.Text()
		_, err = st.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Hour})
		require.NoError(t, err)
		if name == recent {
			require.NoError(t, st.Release(ctx, name, tok, 0))
		}
	}
	// Let two hours pass for old, by moving its release back: the fence floor still comes
	// from the database's clock, as it would two hours later.
	_, err = srv.admin.Exec(ctx, "UPDATE "+srv.table+" SET expires_at = now() - interval '2 hours' WHERE name = $1", old)
	require.NoError(t, err)

	n, err := st.Reclaim(ctx, time.Hour)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	for name, want := range map[string]uint64{old: 0, recent: 1, held: 1} {
		info, err := st.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, want == 0, info.Fence == 0, "%s: %+v", name, info)
	}
	fence, err := st.Acquire(ctx, guard.Request{Name: old, Token: rand.Text(), TTL: time.Minute})
	require.NoError(t, err)
	assert.Greater(t, fence, last, "the fence of a reclaimed name went backwards")
}

// TestTransientRetry breaks the connections of a pool behind its back: the next acquire,
// extend and release each find a dead connection, and try once more on a new one.
func TestTransientRetry(t *testing.T) {
	srv := startServer(t)
	st, rt := srv.store(t)
	ctx := t.Context()
	name, tok := "transient:"+rand.Text(), rand.Text()
	_, err := st.Acquire(ctx, guard.Request{Name: name, Token: rand.Text(), TTL: time.Millisecond})
	require.NoError(t, err) // the pool has a connection now

	ops := []struct {
		name string
		do   func() error
	}{
		{"Acquire", func() error {
			_, err := st.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Minute})
			return err
		}},
		{"Extend", func() error { return st.Extend(ctx, []guard.Lease{{Name: name, Token: tok, TTL: time.Minute}})[0] }},
		{"Release", func() error { return st.Release(ctx, name, tok, 0) }},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			srv.terminate(t, st.pool)
			before := rt.Load()
			require.NoError(t, op.do())
			assert.EqualValues(t, 2, rt.Load()-before, "not tried again on a new connection")
		})
	}
}

// TestServerRestart kills the database while a lock is held: the holder's context ends with
// ErrLockLost before its lease could end, and once the server is back, fences go on rising.
func TestServerRestart(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	pg := testserver.StartPostgresServer(t)
	srv := on(t, pg)
	st, _ := srv.store(t)
	g := guard.New(st, guard.WithWatchdogTimeout(ttl))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	ctx, name := t.Context(), "restart:"+rand.Text()

	var fences []uint64
	for range 3 {
		l, err := g.TryAcquire(ctx, name)
		require.NoError(t, err)
		fences = append(fences, l.Fence())
		require.NoError(t, l.Release(ctx))
	}
	held, err := g.Acquire(ctx, name)
	require.NoError(t, err)
	deadline := held.Deadline()

	pg.Kill()
	select {
	case <-held.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the holder's context outlived its lock after the server died")
	}
	ended := time.Now()
	require.ErrorIs(t, held.Err(), guard.ErrLockLost)
	assert.True(t, ended.Before(deadline.Add(watchdog.Drift(ttl))), "lost at %v, after the lease could end", ended)
	t.Logf("lost %v before the deadline + drift; cause: %v", deadline.Add(watchdog.Drift(ttl)).Sub(ended), held.Err())

	pg.Restart()
	// The row survived the crash, lease and all: the next owner waits for it to run out.
	next, err := g.Acquire(ctx, name, guard.WaitTime(10*ttl))
	require.NoError(t, err)
	t.Logf("fences before the crash %v, %d held when it died, %d after the restart", fences, held.Fence(), next.Fence())
	assert.Greater(t, next.Fence(), held.Fence())
	require.NoError(t, next.Release(ctx))
}

func TestPayload(t *testing.T) {
	long := strings.Repeat("t", maxPayload)
	cases := []struct {
		name, lock, token, wantToken string
	}{
		{"Plain", "a", "tok", "tok"},
		{"ColonsAndDigits", "1:2:3", "4:5", "4:5"},
		{"EmptyToken", "n", "", ""},
		{"LongName", strings.Repeat("é", guard.MaxNameLen/2), "tok", "tok"},
		{"TokenTooLong", "n", long, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := payload(tc.lock, tc.token)
			assert.Less(t, len(p), 8000)
			name, token, ok := parsePayload(p)
			require.True(t, ok)
			assert.Equal(t, tc.lock, name)
			assert.Equal(t, tc.wantToken, token)
		})
	}
	for _, bad := range []string{"", "x", "3:ab", "-1:a", "2:ab"} {
		_, _, ok := parsePayload(bad)
		assert.False(t, ok, "%q", bad)
	}
}

func TestSuccessor(t *testing.T) {
	cases := []struct {
		prefix, want string
		ok           bool
	}{
		{"", "", false},
		{"a", "b", true},
		{"job/", "job0", true},
		{"é", "ê", true},
		{"a\U0010FFFF", "b", true},
		{"\U0010FFFF", "", false},
		{"\uD7FF", "\uE000", true},
		{"z\xff", "{", true},
	}
	for _, tc := range cases {
		got, ok := successor(tc.prefix)
		assert.Equal(t, tc.ok, ok, "%q", tc.prefix)
		assert.Equal(t, tc.want, got, "%q", tc.prefix)
	}
}
