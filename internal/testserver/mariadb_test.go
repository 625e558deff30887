package testserver

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func openMySQL(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestStartMySQL(t *testing.T) {
	m := StartMySQL(t)
	db := openMySQL(t, m.DSN)
	var version, database string
	require.NoError(t, db.QueryRowContext(t.Context(), "SELECT VERSION(), DATABASE()").Scan(&version, &database))
	t.Logf("%s at %s (external: %v)", version, m.Addr, m.External)
	assert.Equal(t, m.Database, database)
	assert.NotEqual(t, m.Database, databaseName(t), "database names must differ")
}

// TestMariaDBKillRestartPause kills the server, restarts it on the same port and data, and
// pauses it: committed rows survive the crash, and a paused server answers nothing until it
// is resumed.
func TestMariaDBKillRestartPause(t *testing.T) {
	m := StartMariaDB(t)
	db := openMySQL(t, m.DSN)
	ctx := t.Context()
	_, err := db.ExecContext(ctx, "CREATE TABLE t (k INT PRIMARY KEY)")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)

	m.Kill()
	m.Kill() // a second Kill is harmless
	require.Error(t, db.PingContext(ctx), "a killed server must not answer")

	m.Restart(t)
	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n), "after the restart")
	assert.Equal(t, 1, n, "a committed row was lost in the crash")

	m.Pause(t)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = db.QueryRowContext(short, "SELECT COUNT(*) FROM t").Scan(&n)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a paused server answered")
	m.Resume(t)
	require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n), "after resuming")
}
