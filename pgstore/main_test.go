package pgstore

import (
	"context"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard/internal/holdertest"
	"github.com/guardlock/guard/internal/testserver"
)

func TestMain(m *testing.M) {
	holdertest.Main(openHolder)
	goleak.VerifyTestMain(m)
}

// server is one PostgreSQL server of a test and a table of its own on it.
type server struct {
	pg    *testserver.Postgres
	table string
	admin *pgxpool.Pool // behind the stores' backs: the harness's Delete, Overwrite, Wipe
}

// startServer starts a server of the test's own (or uses GUARD_POSTGRES_DSN's) and creates a
// table no other test uses.
func startServer(tb testing.TB) *server {
	tb.Helper()
	return on(tb, testserver.StartPostgres(tb))
}

// on creates a table no other test uses on pg, dropped when the test ends.
func on(tb testing.TB, pg *testserver.Postgres) *server {
	tb.Helper()
	s := &server{pg: pg, table: "guard_test_" + strings.ToLower(rand.Text()[:10])}
	s.admin = newPool(tb, pg.DSN, nil)
	require.NoError(tb, New(s.admin, WithTable(s.table)).CreateTable(tb.Context()))
	if pg.External {
		tb.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := s.admin.Exec(ctx, "DROP TABLE IF EXISTS "+s.table)
			if err != nil {
				tb.Errorf("drop %s: %v", s.table, err)
			}
		})
	}
	return s
}

// store returns a Store on s's table with a pool of its own, as a service instance would
// have, and the count of its round trips.
func (s *server) store(tb testing.TB) (*Store, *roundTrips) {
	tb.Helper()
	rt := &roundTrips{}
	return New(newPool(tb, s.pg.DSN, rt), WithTable(s.table)), rt
}

// newPool opens a pool on dsn, closed when the test ends; rt, when not nil, counts its round
// trips.
func newPool(tb testing.TB, dsn string, rt *roundTrips, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(tb, err)
	// A name of its own, so that a test can find its connections on the server.
	cfg.ConnConfig.RuntimeParams["application_name"] = "guard-test-" + rand.Text()[:8]
	if rt != nil {
		cfg.ConnConfig.Tracer = rt
		cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
			// pgxpool's default: a connection idle for over a second is pinged before use.
			if p.IdleDuration > time.Second {
				rt.n.Add(1)
				return true
			}
			return false
		}
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// terminate ends every server process of pool's connections (pg_terminate_backend), and
// waits until they are gone. The pool does not know yet.
func (s *server) terminate(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	tag, err := s.admin.Exec(tb.Context(),
		"SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1", app)
	require.NoError(tb, err)
	require.Positive(tb, tag.RowsAffected(), "no connection of %s to terminate", app)
}

// roundTrips counts the requests a pool sends: queries and pings of idle connections (n), and
// apart from them the statements pgx prepares on a connection the first time it runs them
// (prepares), each one more round trip.
type roundTrips struct{ n, prepares atomic.Int64 }

func (rt *roundTrips) Load() int64 { return rt.n.Load() }

func (rt *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	rt.n.Add(1)
	return ctx
}

func (rt *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (rt *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}

func (rt *roundTrips) TracePrepareEnd(_ context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	if !d.AlreadyPrepared {
		rt.prepares.Add(1)
	}
}

// contextWithTimeout is context.WithTimeout on the test's context.
func contextWithTimeout(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}
