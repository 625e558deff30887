package pgstore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
)

// TestConformance runs the backend conformance suite on a PostgreSQL server of its own. Every
// backend the suite asks for has its own pool; Delete, Overwrite and Wipe go behind their
// backs through an admin pool. Round trips are counted with pgx's tracer.
func TestConformance(t *testing.T) {
	locktest.Run(t, startServer(t).harness())
}

// BenchmarkConformance runs the suite's benchmarks.
func BenchmarkConformance(b *testing.B) {
	locktest.Bench(b, startServer(b).harness())
}

func (s *server) harness() locktest.Harness {
	exec := func(tb testing.TB, sql string, args ...any) int64 {
		tag, err := s.admin.Exec(context.Background(), sql, args...)
		require.NoError(tb, err)
		return tag.RowsAffected()
	}
	return locktest.Harness{
		New: func(tb testing.TB) locktest.Target {
			st, rt := s.store(tb)
			return locktest.Target{Backend: st, RoundTrips: rt.Load}
		},
		Delete: func(tb testing.TB, name string) {
			// Every row of the name: its holders, its queue and its fence.
			n := exec(tb, "DELETE FROM "+s.table+" WHERE name = $1", name)
			require.Positive(tb, n, "no lock %q to delete", name)
		},
		Overwrite: func(tb testing.TB, name string) {
			// The intruder keeps the holder's lease.
			n := exec(tb, "UPDATE "+s.table+" SET token = 'intruder' WHERE name = $1 AND token <> '' AND NOT waiting", name)
			require.EqualValues(tb, 1, n, "no lock %q to overwrite", name)
		},
		Wipe: func(tb testing.TB) { exec(tb, "TRUNCATE "+s.table) },
		Killable: func(tb testing.TB) (locktest.Target, func()) {
			pg := testserver.StartPostgresServer(tb)
			st, rt := on(tb, pg).store(tb)
			return locktest.Target{Backend: st, RoundTrips: rt.Load}, pg.Kill
		},
	}
}
