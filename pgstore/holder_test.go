package pgstore

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/holdertest"
)

// holderConn is the connection string of a holder process (holdertest) on srv: its DSN and
// its table, as a query string.
func holderConn(srv *server) string {
	return url.Values{"dsn": {srv.pg.DSN}, "table": {srv.table}}.Encode()
}

// openHolder opens the Store of a holder process from holderConn's string.
func openHolder(conn string) (guard.Backend, func(), error) {
	v, err := url.ParseQuery(conn)
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.New(context.Background(), v.Get("dsn"))
	if err != nil {
		return nil, nil, err
	}
	return New(pool, WithTable(v.Get("table"))), pool.Close, nil
}

// TestPausedHolder: a holder process paused until its lease runs out by the database's clock
// loses the lock to the next, whose fence is higher, and its late release frees nothing
// (holdertest.Paused).
func TestPausedHolder(t *testing.T) {
	srv := startServer(t)
	holdertest.Paused(t, holderConn(srv), func(t *testing.T) *guard.Guard { return guardOn(t, srv) })
}

// TestKilledHolder: a waiter takes the lock of a holder process killed without a release
// once its lease runs out (holdertest.Killed).
func TestKilledHolder(t *testing.T) {
	srv := startServer(t)
	holdertest.Killed(t, holderConn(srv), func(t *testing.T) *guard.Guard { return guardOn(t, srv) })
}

// guardOn returns a Guard on a Store of srv with a pool of its own, closed when the test ends.
func guardOn(t *testing.T, srv *server) *guard.Guard {
	st, _ := srv.store(t)
	g := guard.New(st)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}
