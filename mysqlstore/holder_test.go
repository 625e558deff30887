package mysqlstore

import (
	"database/sql"
	"testing"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/holdertest"
)

// openHolder opens the Store of a holder process (holdertest): conn is the DSN.
func openHolder(dsn string) (guard.Backend, func(), error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, nil, err
	}
	return New(db), func() { _ = db.Close() }, nil
}

// TestPausedHolder: a holder process paused past its lease loses the lock to the next, whose
// fence is higher, and its late release frees nothing (holdertest.Paused).
func TestPausedHolder(t *testing.T) {
	srv := startServer(t)
	holdertest.Paused(t, srv.DSN, func(t *testing.T) *guard.Guard { return srv.guard(t) })
}

// TestKilledHolder: a waiter takes the lock of a holder process killed without a release
// once its lease runs out (holdertest.Killed).
func TestKilledHolder(t *testing.T) {
	srv := startServer(t)
	holdertest.Killed(t, srv.DSN, func(t *testing.T) *guard.Guard { return srv.guard(t) })
}
