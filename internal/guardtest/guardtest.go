// Package guardtest gives the tests of the packages built on guard (decorators, middleware,
// the scheduler adapters) their Guards: several Guards on one shared backend, as several
// service instances share a server, on memstore or on real servers that the test starts
// (Servers lists every backend). TickLog records the runs of a scheduled job by tick.
package guardtest

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/redisstore"
)

// Factory returns a new Guard — a new service instance — on the backend that the whole test
// run shares, closed when the test ends.
type Factory func(t *testing.T) *guard.Guard

// Memory returns a Factory whose Guards share one memstore.Store.
func Memory() Factory {
	store := memstore.New()
	return func(t *testing.T) *guard.Guard { return newGuard(t, store) }
}

// Redis starts a redis-server for the test and returns a Factory whose Guards each have their
// own client to it.
func Redis(tb testing.TB) Factory {
	srv := testserver.StartRedis(tb)
	return func(t *testing.T) *guard.Guard {
		t.Helper()
		client := redis.NewClient(&redis.Options{Addr: srv.Addr})
		// Cleanups run last in, first out: the Guard closes first, then its client.
		t.Cleanup(func() { _ = client.Close() })
		return newGuard(t, redisstore.New(client))
	}
}

func newGuard(t *testing.T, b guard.Backend) *guard.Guard {
	t.Helper()
	g := guard.New(b)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}

// Prefix returns literal template text unique to the test, so that tests sharing a backend
// never share a lock name. It holds letters and digits only, which templates never escape, so
// it does not change how the rest of a template escapes values.
func Prefix(t *testing.T, pkg string) string {
	keep := func(r rune) rune {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
			return r
		}
		return -1
	}
	return pkg + strings.Map(keep, t.Name()) + ":"
}
