package mysqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/watchdog"
)

func TestNewPanics(t *testing.T) {
	db, err := sql.Open("mysql", "user@tcp(127.0.0.1:1)/none") // no I/O until used
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	assert.PanicsWithValue(t, "guard/mysqlstore: New with a nil *sql.DB", func() { New(nil) })
	assert.PanicsWithValue(t, "guard/mysqlstore: New with a nil Option", func() { New(db, nil) })

	valid := []string{"locks", "guard_locks", "_x", "app.locks", "app_2.locks_2", "select", strings.Repeat("t", 64)}
	for _, name := range valid {
		t.Run("Valid/"+name, func(t *testing.T) {
			assert.NotPanics(t, func() { New(db, WithTable(name)) })
		})
	}
	invalid := []string{
		"", ".", "a.", ".a", "a.b.c", "1locks", "lo cks", "locks;", "ä",
		"x; DROP TABLE guard_locks", "locks` WHERE 1=1 -- ", "`locks`", "\"locks\"", "locks/*", "a.b;c",
		strings.Repeat("t", 65),
	}
	for _, name := range invalid {
		t.Run(fmt.Sprintf("Invalid/%q", name), func(t *testing.T) {
			assert.PanicsWithValue(t, "guard/mysqlstore: WithTable("+fmt.Sprintf("%q", name)+"): "+tableErr(name), func() {
				New(db, WithTable(name))
			})
		})
	}
}

// tableErr is splitTable's reason for refusing name.
func tableErr(name string) string {
	_, err := splitTable(name)
	if err == nil {
		return "<accepted>"
	}
	return err.Error()
}

// TestTables uses tables other than the default: schema-qualified, and named by a reserved
// word (which only works because the Store quotes the name). CreateTable is idempotent: a
// second call neither fails nor loses a row.
func TestTables(t *testing.T) {
	srv := startServer(t)
	for _, table := range []string{srv.Database + ".other_locks", "select"} {
		t.Run(table, func(t *testing.T) {
			s := New(srv.open(t, nil), WithTable(table))
			require.NoError(t, s.CreateTable(t.Context()))
			r := guard.Request{Name: "n", Token: rand.Text(), TTL: time.Minute}
			fence, err := s.Acquire(t.Context(), r)
			require.NoError(t, err)
			require.NoError(t, s.CreateTable(t.Context()), "CreateTable again")
			info, err := s.Inspect(t.Context(), "n")
			require.NoError(t, err)
			assert.True(t, info.Held, "CreateTable again lost a lock")
			assert.Equal(t, fence, info.Fence)
			require.NoError(t, s.Release(t.Context(), r.Name, r.Token, 0))
		})
	}
	var n int
	require.NoError(t, srv.admin.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM guard_locks").Scan(&n))
	assert.Zero(t, n, "a lock went to the default table")
}

// TestTimeZones runs sessions whose time_zone differs by twenty hours against one lock: they
// must agree on when it was taken and when its lease ends, because the store reads
// UTC_TIMESTAMP and keeps DATETIME, neither of which a session's time zone changes.
func TestTimeZones(t *testing.T) {
	srv := startServer(t)
	zones := []struct {
		zone  string
		hours int
	}{{"+00:00", 0}, {"+09:00", 9}, {"-11:00", -11}}
	stores := make([]*Store, len(zones))
	for i, z := range zones {
		stores[i], _ = srv.store(t, session("time_zone", "'"+z.zone+"'"))
		// The sessions do differ: NOW() is local to each.
		var offset int
		require.NoError(t, stores[i].db.QueryRowContext(t.Context(),
			"SELECT TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW())").Scan(&offset))
		require.InDelta(t, z.hours*60, offset, 1, "session time zone %s", z.zone)
	}

	for i, z := range zones {
		t.Run("TakenIn"+z.zone, func(t *testing.T) {
			const ttl = time.Minute
			name := "tz:" + rand.Text()
			_, err := stores[i].Acquire(t.Context(), guard.Request{Name: name, Token: rand.Text(), TTL: ttl})
			require.NoError(t, err)
			var first guard.LockInfo
			for j, other := range stores {
				info, err := other.Inspect(t.Context(), name)
				require.NoError(t, err)
				if j == 0 {
					first = info
				}
				assert.Equal(t, first.AcquiredAt, info.AcquiredAt, "seen from %s", zones[j].zone)
				assert.InDelta(t, first.Remaining, info.Remaining, float64(5*time.Second), "seen from %s", zones[j].zone)
				assert.Greater(t, info.Remaining, ttl-5*time.Second, "seen from %s", zones[j].zone)
				assert.LessOrEqual(t, info.Remaining, ttl, "seen from %s", zones[j].zone)
				assert.WithinDuration(t, time.Now(), info.AcquiredAt, 5*time.Second, "seen from %s", zones[j].zone)
				if j != i {
					_, err := other.Acquire(t.Context(), guard.Request{Name: name, Token: rand.Text(), TTL: ttl})
					var busy *guard.BusyError
					require.ErrorAs(t, err, &busy, "seen from %s", zones[j].zone)
					assert.Greater(t, busy.Remaining, ttl-5*time.Second, "seen from %s", zones[j].zone)
					assert.Less(t, busy.Remaining, ttl+time.Second, "seen from %s", zones[j].zone)
				}
			}
		})
	}

	t.Run("LeaseEndsForAll", func(t *testing.T) {
		const lease = 300 * time.Millisecond
		name := "tz:" + rand.Text()
		west := guard.New(stores[2])
		east := guard.New(stores[1])
		t.Cleanup(func() { _ = west.Close(context.Background()); _ = east.Close(context.Background()) })
		first, err := west.TryAcquire(t.Context(), name, guard.LeaseTime(lease))
		require.NoError(t, err)
		before, err := stores[0].Inspect(t.Context(), name)
		require.NoError(t, err)
		second, err := east.Acquire(t.Context(), name, guard.WaitTime(10*lease))
		require.NoError(t, err)
		after, err := stores[0].Inspect(t.Context(), name)
		require.NoError(t, err)
		assert.Greater(t, second.Fence(), first.Fence())
		took := after.AcquiredAt.Sub(before.AcquiredAt)
		t.Logf("taken in +09:00 %v after -11:00 took it for %v, by the database's clock", took, lease)
		assert.GreaterOrEqual(t, took, lease, "taken before the lease ended")
	})
}

// TestSessions runs one scenario — a new name, a retry, a busy answer, an extension, a
// take-over after the lease ended, a MinHold release, a forced release — on sessions whose
// settings could change what a statement means: sql_modes that change quoting, escaping and
// strictness; MariaDB's SIMULTANEOUS_ASSIGNMENT, under which every assignment of ON
// DUPLICATE KEY UPDATE sees the old row; a driver that reports matched rather than changed
// rows (clientFoundRows).
func TestSessions(t *testing.T) {
	srv := startServer(t)
	var version string
	require.NoError(t, srv.admin.QueryRowContext(t.Context(), "SELECT VERSION()").Scan(&version))
	cases := []struct {
		name      string
		configure func(*mysql.Config)
		mariadb   bool // the setting exists only on MariaDB
	}{
		{"Default", func(*mysql.Config) {}, false},
		{"ANSI", session("sql_mode", "'ANSI'"), false},
		{"NoBackslashEscapes", session("sql_mode", "'NO_BACKSLASH_ESCAPES,STRICT_TRANS_TABLES'"), false},
		{"NotStrict", session("sql_mode", "''"), false},
		{"SimultaneousAssignment", session("sql_mode", "'SIMULTANEOUS_ASSIGNMENT,STRICT_TRANS_TABLES'"), true},
		{"ClientFoundRows", func(c *mysql.Config) { c.ClientFoundRows = true }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mariadb && !strings.Contains(version, "MariaDB") {
				t.Skipf("%s is MariaDB only; this server is %s", tc.name, version)
			}
			s, _ := srv.store(t, tc.configure)
			other, _ := srv.store(t)
			scenario(t, srv, s, other)
		})
	}
}

// scenario takes a lock through s in every way the acquire statement can go, with other as
// the other owner.
func scenario(t *testing.T, srv *server, s, other *Store) {
	ctx := t.Context()
	const ttl = time.Minute
	name := "scenario:" + rand.Text() + ":'\"\\%_`"
	mine := guard.Request{Name: name, Token: rand.Text(), TTL: ttl, Instance: "host/1 ünïcode", Label: `report:{day} 'quoted' \ "`}
	theirs := guard.Request{Name: name, Token: rand.Text(), TTL: ttl, Instance: "other"}
	busy := func(s *Store, r guard.Request, atLeast time.Duration) {
		t.Helper()
		_, err := s.Acquire(ctx, r)
		var be *guard.BusyError
		require.ErrorAs(t, err, &be)
		assert.Greater(t, be.Remaining, atLeast)
		assert.Less(t, be.Remaining, ttl+time.Second)
	}
	endLease := func() {
		t.Helper()
		_, err := srv.admin.ExecContext(ctx,
			"UPDATE guard_locks SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?", name)
		require.NoError(t, err)
	}

	// A new name, and a retry of the same request.
	f1, err := s.Acquire(ctx, mine)
	require.NoError(t, err)
	again, err := s.Acquire(ctx, mine)
	require.NoError(t, err)
	assert.Equal(t, f1, again, "a retry by the holder")
	busy(other, theirs, ttl-5*time.Second)
	busy(s, theirs, ttl-5*time.Second)
	info, err := s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, mine.Instance, info.Instance)
	assert.Equal(t, mine.Label, info.Label)

	// Extend: the holder can, another token cannot.
	errs := s.Extend(ctx, []guard.Lease{{Name: name, Token: mine.Token, TTL: ttl}, {Name: name, Token: theirs.Token, TTL: ttl}})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], guard.ErrNotHeld)

	// The lease ends; s takes the name over for another token.
	endLease()
	f2, err := s.Acquire(ctx, theirs)
	require.NoError(t, err)
	assert.Greater(t, f2, f1)
	info, err = other.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held, "a take-over left the lease ended")
	assert.Greater(t, info.Remaining, ttl-5*time.Second, "a take-over did not set the lease")
	assert.Equal(t, f2, info.Fence)
	assert.Equal(t, "other", info.Instance)
	busy(s, mine, ttl-5*time.Second)
	require.ErrorIs(t, s.Release(ctx, name, mine.Token, 0), guard.ErrNotHeld)

	// A MinHold release: taken for the window, by nobody.
	require.NoError(t, s.Release(ctx, name, theirs.Token, ttl))
	busy(other, mine, ttl-5*time.Second)
	busy(s, theirs, ttl-5*time.Second)
	require.ErrorIs(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: theirs.Token, TTL: ttl}})[0], guard.ErrNotHeld)
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Kept)

	// A forced release frees it; the next owner gets a higher fence.
	require.NoError(t, s.ForceRelease(ctx, name, 0))
	require.ErrorIs(t, s.ForceRelease(ctx, name, 0), guard.ErrNotHeld)
	f3, err := s.Acquire(ctx, mine)
	require.NoError(t, err)
	assert.Greater(t, f3, f2)
	require.NoError(t, s.Release(ctx, name, mine.Token, 0))
	require.ErrorIs(t, s.Release(ctx, name, mine.Token, 0), guard.ErrNotHeld)
}

// TestExtendBatch extends batches in which every lease, some or none still hold their names,
// and counts the round trips of each.
func TestExtendBatch(t *testing.T) {
	srv := startServer(t)
	s, rt := srv.store(t)
	ctx := t.Context()
	take := func(n int) []guard.Lease {
		leases := make([]guard.Lease, n)
		for i := range leases {
			leases[i] = guard.Lease{Name: fmt.Sprintf("batch:%s:%04d", rand.Text(), i), Token: rand.Text(), TTL: time.Minute}
			_, err := s.Acquire(ctx, guard.Request{Name: leases[i].Name, Token: leases[i].Token, TTL: time.Minute})
			require.NoError(t, err)
		}
		return leases
	}
	extend := func(leases []guard.Lease, trips int64) []error {
		t.Helper()
		before := rt.Load()
		errs := s.Extend(ctx, leases)
		require.Len(t, errs, len(leases))
		assert.Equal(t, trips, rt.Load()-before, "round trips")
		return errs
	}
	held := func(errs []error, want ...bool) {
		t.Helper()
		for i, err := range errs {
			if want[i] {
				assert.NoError(t, err, "lease %d", i)
			} else {
				assert.ErrorIs(t, err, guard.ErrNotHeld, "lease %d", i)
			}
		}
	}

	t.Run("AllHeld", func(t *testing.T) {
		held(extend(take(3), 1), true, true, true)
	})
	t.Run("Empty", func(t *testing.T) {
		extend(nil, 0)
	})
	t.Run("TTLs", func(t *testing.T) {
		leases := take(3)
		for i := range leases {
			leases[i].TTL = time.Duration(i+1) * 10 * time.Minute
		}
		held(extend(leases, 1), true, true, true)
		for i, l := range leases {
			info, err := s.Inspect(ctx, l.Name)
			require.NoError(t, err)
			assert.InDelta(t, l.TTL, info.Remaining, float64(5*time.Second), "lease %d", i)
		}
	})
	t.Run("SomeLost", func(t *testing.T) {
		leases := take(4)
		_, err := srv.admin.ExecContext(ctx, "UPDATE guard_locks SET token = 'intruder' WHERE name = ? AND token <> ''", leases[1].Name)
		require.NoError(t, err)
		require.NoError(t, s.ForceRelease(ctx, leases[2].Name, 0))
		// The UPDATE changes two rows of four: one more round trip says which.
		held(extend(leases, 2), true, false, false, true)
	})
	t.Run("NoneHeld", func(t *testing.T) {
		leases := take(2)
		for i := range leases {
			leases[i].Token = rand.Text()
		}
		held(extend(leases, 1), false, false)
	})
	t.Run("InvalidLeases", func(t *testing.T) {
		leases := take(1)
		leases = append(leases, guard.Lease{Name: leases[0].Name, TTL: time.Minute}, guard.Lease{Name: "", Token: "x", TTL: time.Minute})
		// Only the first reaches the server.
		held(extend(leases, 1), true, false, false)
	})
	t.Run("Repeated", func(t *testing.T) {
		leases := take(1)
		leases = append(leases, leases[0])
		// The statement names the lock once and counts its row once: one round trip.
		held(extend(leases, 1), true, true)
	})
	t.Run("Large", func(t *testing.T) {
		leases := take(maxBatch + 1)
		errs := extend(leases, 2) // one statement per maxBatch leases
		for i, err := range errs {
			require.NoError(t, err, "lease %d", i)
		}
	})
}

// TestReclaim deletes the rows of names free for longer than the idle time, and nothing else:
// not a held name, a MinHold window, a name released just now. The fence of a reclaimed name
// goes on increasing.
func TestReclaim(t *testing.T) {
	srv := startServer(t)
	s, _ := srv.store(t)
	ctx := t.Context()
	take := func(name string) (string, uint64) {
		t.Helper()
		tok := rand.Text()
		fence, err := s.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Minute})
		require.NoError(t, err)
		return tok, fence
	}
	// idle pretends name was freed two minutes ago.
	idle := func(name string) {
		t.Helper()
		_, err := srv.admin.ExecContext(ctx,
			"UPDATE guard_locks SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE WHERE name = ?", name)
		require.NoError(t, err)
	}

	tok, oldFence := take("idle")
	require.NoError(t, s.Release(ctx, "idle", tok, 0))
	idle("idle")
	_, _ = take("held")
	tok, _ = take("kept")
	require.NoError(t, s.Release(ctx, "kept", tok, time.Hour))
	tok, _ = take("recent")
	require.NoError(t, s.Release(ctx, "recent", tok, 0))
	const many = 2*reclaimBatch + 50
	for i := range many {
		name := fmt.Sprintf("many:%04d", i)
		_, _ = take(name)
		idle(name) // a crashed holder's lease, ended two minutes ago
	}

	_, err := s.Reclaim(ctx, MinReclaimIdle-time.Second)
	require.ErrorIs(t, err, ErrIdleTooShort)
	require.Error(t, err, "an idle time under a minute")
	n, err := s.Reclaim(ctx, MinReclaimIdle)
	require.NoError(t, err)
	assert.Equal(t, int64(many+1), n)

	for _, name := range []string{"held", "kept", "recent"} {
		info, err := s.Inspect(ctx, name)
		require.NoError(t, err)
		assert.NotZero(t, info.Fence, "%s was reclaimed", name)
	}
	info, err := s.Inspect(ctx, "idle")
	require.NoError(t, err)
	assert.Zero(t, info.Fence, "the idle name was kept")
	_, newFence := take("idle")
	t.Logf("fence before Reclaim %d, after %d", oldFence, newFence)
	assert.Greater(t, newFence, oldFence, "the fence went backwards after Reclaim")

	n, err = s.Reclaim(ctx, MinReclaimIdle)
	require.NoError(t, err)
	assert.Zero(t, n)
}

// TestServerRestart kills the server while a lock is held: the holder's context must end
// with ErrLockLost by its validity deadline, although the server never answers. After a
// restart on the same data, the same Store (its pool replaces the broken connections) takes
// the name again, once the dead lease has run out, with a higher fence.
func TestServerRestart(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	srv := startMariaDB(t)
	s, _ := srv.store(t)
	g := guard.New(s, guard.WithWatchdogTimeout(ttl))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	name := "restart:" + rand.Text()
	l, err := g.Acquire(t.Context(), name)
	require.NoError(t, err)

	srv.Kill()
	deadline := l.Deadline()
	select {
	case <-l.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the holder's context outlived its lock after the server died")
	}
	ended := time.Now()
	require.ErrorIs(t, l.Err(), guard.ErrLockLost)
	// The last deadline the lock trusted: a renewal answered as the server went away may have
	// moved it past the one read above.
	deadline = l.Deadline()
	assert.True(t, ended.Before(deadline.Add(watchdog.Drift(ttl))), "lost after the lease could have ended")
	t.Logf("server killed; context ended %v after the deadline, %v before the lease could end: %v",
		ended.Sub(deadline), deadline.Add(watchdog.Drift(ttl)).Sub(ended), l.Err())

	srv.Restart(t)
	info, err := s.Inspect(t.Context(), name)
	require.NoError(t, err)
	assert.Equal(t, l.Fence(), info.Fence, "the row did not survive the crash")
	next, err := g.Acquire(t.Context(), name, guard.WaitTime(10*ttl))
	require.NoError(t, err)
	t.Logf("after the restart: fence %d, before %d", next.Fence(), l.Fence())
	assert.Greater(t, next.Fence(), l.Fence())
	require.NoError(t, next.Release(t.Context()))
}

// TestPausedServer freezes the server (SIGSTOP) while a lock is held: renewals hang rather
// than fail, and the holder's context must still end with ErrLockLost by its deadline. Once
// the server resumes, another instance takes the name with a higher fence.
func TestPausedServer(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	srv := startMariaDB(t)
	holder := srv.guard(t, guard.WithWatchdogTimeout(ttl))
	name := "paused-server:" + rand.Text()
	l, err := holder.Acquire(t.Context(), name)
	require.NoError(t, err)

	srv.Pause(t)
	deadline := l.Deadline()
	select {
	case <-l.Done():
	case <-time.After(2 * ttl):
		srv.Resume(t)
		t.Fatal("the holder's context outlived its lock while the server was paused")
	}
	ended := time.Now()
	srv.Resume(t)
	require.ErrorIs(t, l.Err(), guard.ErrLockLost)
	// The last deadline the lock trusted: a renewal answered as the server froze may have moved
	// it past the one read above.
	deadline = l.Deadline()
	assert.True(t, ended.Before(deadline.Add(watchdog.Drift(ttl))), "lost after the lease could have ended")
	t.Logf("server paused; context ended %v after the deadline, %v before the lease could end: %v",
		ended.Sub(deadline), deadline.Add(watchdog.Drift(ttl)).Sub(ended), l.Err())

	next, err := srv.guard(t).Acquire(t.Context(), name, guard.WaitTime(10*ttl))
	require.NoError(t, err)
	assert.Greater(t, next.Fence(), l.Fence())
	require.NoError(t, next.Release(t.Context()))
}

// TestStatementsPerOperation checks the socket count of round trips against the server's own
// counters, on a server with no other client: each operation is one statement, of the kind
// expected.
func TestStatementsPerOperation(t *testing.T) {
	srv := startMariaDB(t)
	s, rt := srv.store(t)
	ctx := t.Context()
	status := func() map[string]int64 {
		rows, err := srv.admin.QueryContext(ctx,
			"SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_call_procedure', 'Com_update', 'Com_select')")
		require.NoError(t, err)
		defer rows.Close()
		m := make(map[string]int64)
		for rows.Next() {
			var k string
			var v int64
			require.NoError(t, rows.Scan(&k, &v))
			m[k] = v
		}
		require.NoError(t, rows.Err())
		return m
	}
	r := guard.Request{Name: "ops", Token: rand.Text(), TTL: time.Minute}
	other := guard.Request{Name: "ops", Token: rand.Text(), TTL: time.Minute}
	ops := []struct {
		name string
		kind string
		do   func() error
	}{
		{"acquire", "Com_call_procedure", func() error { _, err := s.Acquire(ctx, r); return err }},
		{"acquire again", "Com_call_procedure", func() error { _, err := s.Acquire(ctx, r); return err }},
		{"busy acquire", "Com_call_procedure", func() error {
			_, err := s.Acquire(ctx, other)
			if err == nil {
				return fmt.Errorf("not busy")
			}
			return nil
		}},
		{"extend", "Com_update", func() error { return s.Extend(ctx, []guard.Lease{{Name: r.Name, Token: r.Token, TTL: time.Minute}})[0] }},
		{"inspect", "Com_select", func() error { _, err := s.Inspect(ctx, r.Name); return err }},
		{"list", "Com_select", func() error { _, _, err := s.List(ctx, "", "", 10); return err }},
		{"release with MinHold", "Com_call_procedure", func() error { return s.Release(ctx, r.Name, r.Token, time.Minute) }},
		{"force release", "Com_call_procedure", func() error { return s.ForceRelease(ctx, r.Name, 0) }},
		{"acquire after release", "Com_call_procedure", func() error { _, err := s.Acquire(ctx, other); return err }},
		{"release", "Com_call_procedure", func() error { return s.Release(ctx, r.Name, other.Token, 0) }},
	}
	for _, op := range ops {
		before, trips := status(), rt.Load()
		require.NoError(t, op.do(), op.name)
		after := status()
		// Questions counts the SHOW STATUS that reads it.
		assert.Equal(t, int64(1), after["Questions"]-before["Questions"]-1, "%s: statements", op.name)
		if op.kind == "Com_call_procedure" {
			// The procedure's own calls of its helpers count too.
			assert.Positive(t, after[op.kind]-before[op.kind], "%s: %s", op.name, op.kind)
		} else {
			assert.Equal(t, int64(1), after[op.kind]-before[op.kind], "%s: %s", op.name, op.kind)
		}
		assert.Equal(t, int64(1), rt.Load()-trips, "%s: round trips at the socket", op.name)
	}
}

// TestDocsDDL checks that the DDL printed in docs/backends.md is what CreateTable runs.
func TestDocsDDL(t *testing.T) {
	doc, err := os.ReadFile("../docs/backends.md")
	require.NoError(t, err)
	assert.Contains(t, string(doc), fill(createTableSQL, "{table}", "`guard_locks`"), "docs/backends.md must print CreateTable's DDL")
}

// TestFill: fill writes a statement as strings.Replacer would — every slot, in one pass,
// literals not looked into again, other braces kept.
func TestFill(t *testing.T) {
	for _, q := range []string{
		"",
		"SELECT 1",
		"{name}",
		"CALL p({name}, {ttl}, {name})",
		"{ttl}{name}{",
		"SELECT '{' , {nam} , {name}}",
		"{names} IN {name}",
	} {
		args := []string{"{names}", "('a','b')", "{name}", "X'7b6e616d657d'/*{name}*/", "{ttl}", "30000"}
		assert.Equal(t, strings.NewReplacer(args...).Replace(q), fill(q, args...), "%q", q)
	}
	assert.Equal(t, "x{y}", fill("x{y}"))
	assert.Equal(t, 1.0, testing.AllocsPerRun(100, func() {
		_ = fill("CALL p({name}, {ttl})", "{name}", "X'61'", "{ttl}", "1")
	}))
}
