package redisstore

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/holdertest"
	"github.com/guardlock/guard/internal/testserver"
)

// openHolder opens the Store of a holder process (holdertest): conn is the server's address.
func openHolder(addr string) (guard.Backend, func(), error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	return New(client), func() { _ = client.Close() }, nil
}

// TestPausedHolder: a holder process paused past its lease loses the lock to the next, whose
// fence is higher, and its late release frees nothing (holdertest.Paused).
func TestPausedHolder(t *testing.T) {
	srv := testserver.StartRedis(t)
	holdertest.Paused(t, srv.Addr, func(t *testing.T) *guard.Guard { return guardOn(t, srv.Addr) })
}

// TestKilledHolder: a waiter takes the lock of a holder process killed without a release
// once its lease runs out (holdertest.Killed).
func TestKilledHolder(t *testing.T) {
	srv := testserver.StartRedis(t)
	holdertest.Killed(t, srv.Addr, func(t *testing.T) *guard.Guard { return guardOn(t, srv.Addr) })
}

// guardOn returns a Guard with its own client to addr, closed when the test ends.
func guardOn(t *testing.T, addr string) *guard.Guard {
	client := redis.NewClient(&redis.Options{Addr: addr})
	g := guard.New(New(client))
	t.Cleanup(func() {
		_ = g.Close(context.Background())
		_ = client.Close()
	})
	return g
}

// TestPausedAmongWaiters (issue 16, case 2): four processes of four goroutines contend for one
// name; a process stopped while it holds the lock — its other goroutines queued behind it —
// keeps the name from the others no longer than its watchdog timeout.
func TestPausedAmongWaiters(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	holdertest.Contended(t, srv.Addr, New(client).Inspect, 5)
}
