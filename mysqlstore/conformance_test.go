package mysqlstore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/locktest"
)

// TestConformance runs the backend conformance suite on one server: a MariaDB of its own, or
// GUARD_MYSQL_DSN's. Round trips are counted at the socket (see roundTrips). The suite skips
// only Waiting/WokenByReleaseOtherGuard: MySQL cannot announce a release to another process.
func TestConformance(t *testing.T) {
	locktest.Run(t, startServer(t).harness())
}

// BenchmarkConformance runs the backend benchmarks of the suite.
func BenchmarkConformance(b *testing.B) {
	locktest.Bench(b, startServer(b).harness())
}

// harness returns the conformance harness on srv. Every backend it makes has a pool of its
// own; Delete, Overwrite and Wipe go behind their backs through the admin pool.
func (srv *server) harness() locktest.Harness {
	return locktest.Harness{
		New: func(tb testing.TB) locktest.Target {
			s, rt := srv.store(tb)
			return locktest.Target{Backend: s, RoundTrips: rt.Load}
		},
		Delete: func(tb testing.TB, name string) {
			// Every row of the name: its holders, its queue and its fence.
			res, err := srv.admin.ExecContext(context.Background(), "DELETE FROM guard_locks WHERE name = ?", name)
			require.NoError(tb, err)
			n, _ := res.RowsAffected()
			require.Positive(tb, n, "no lock %q to delete", name)
		},
		Overwrite: func(tb testing.TB, name string) {
			// The intruder keeps the holder's lease.
			res, err := srv.admin.ExecContext(context.Background(),
				"UPDATE guard_locks SET token = 'intruder' WHERE name = ? AND token <> '' AND NOT waiting AND expires_at > UTC_TIMESTAMP(6)", name)
			require.NoError(tb, err)
			n, _ := res.RowsAffected()
			require.Equal(tb, int64(1), n, "no lock %q to overwrite", name)
		},
		Wipe: func(tb testing.TB) {
			_, err := srv.admin.ExecContext(context.Background(), "DELETE FROM guard_locks")
			require.NoError(tb, err)
		},
		Killable: func(tb testing.TB) (locktest.Target, func()) {
			own := startMariaDB(tb)
			s, rt := own.store(tb)
			return locktest.Target{Backend: s, RoundTrips: rt.Load}, own.Kill
		},
	}
}
