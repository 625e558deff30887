package testserver

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStartPostgres(t *testing.T) {
	p := StartPostgresServer(t)
	conn, err := pgx.Connect(t.Context(), p.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	var fsync, addrs string
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT current_setting('fsync'), current_setting('listen_addresses')").Scan(&fsync, &addrs))
	assert.Equal(t, "off", fsync)
	assert.Equal(t, "127.0.0.1", addrs)
	_, err = conn.Exec(t.Context(), "CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)")
	require.NoError(t, err)

	t.Run("Pause", func(t *testing.T) {
		p.Pause()
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		var n int
		assert.Error(t, pgxOpen(ctx, p.DSN, &n), "a paused server answered")
		p.Resume()
		ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		require.NoError(t, pgxOpen(ctx, p.DSN, &n))
		assert.Equal(t, 7, n)
	})

	t.Run("KillRestart", func(t *testing.T) {
		// A process of the server that escaped the list of its processes (a backend forked as
		// the list was read, reparented to init when the postmaster died): Kill finds it by
		// its working directory. One once hung a chaos run's restart for 17 minutes.
		stray := exec.Command("sleep", "600")
		stray.Dir = p.Dir
		require.NoError(t, stray.Start())
		exited := make(chan error, 1)
		go func() { exited <- stray.Wait() }()
		t.Cleanup(func() { _ = stray.Process.Kill() })

		p.Kill()
		select {
		case err := <-exited:
			assert.Error(t, err, "the stray was killed")
		case <-time.After(5 * time.Second):
			t.Error("Kill left a process of the server's running")
		}
		p.Kill()
		p.Kill() // a second Kill is harmless
		assert.Error(t, conn.Ping(t.Context()), "a killed server must not answer")
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		var n int
		assert.Error(t, pgxOpen(ctx, p.DSN, &n), "a killed server accepted a connection")

		p.Restart()
		require.NoError(t, pgxOpen(t.Context(), p.DSN, &n))
		assert.Equal(t, 7, n, "the data did not survive the restart")
	})
}

// pgxOpen connects to dsn and reads the row of table kept into n.
func pgxOpen(ctx context.Context, dsn string, n *int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, "SELECT n FROM kept").Scan(n)
}
