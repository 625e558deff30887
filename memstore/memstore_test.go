package memstore

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/guardlock/guard/internal/locktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the backend suite with Guards sharing one Store, as instances of a
// service share a server.
func TestConformance(t *testing.T) {
	s := New()
	locktest.Run(t, locktest.Harness{
		New: func(testing.TB) locktest.Target { return locktest.Target{Backend: s} },
		Delete: func(_ testing.TB, name string) {
			s.mu.Lock()
			delete(s.locks, name)
			s.mu.Unlock()
		},
		Overwrite: func(_ testing.TB, name string) {
			s.mu.Lock()
			s.locks[name] = &entry{token: "intruder", expires: time.Now().Add(time.Hour)}
			s.mu.Unlock()
		},
		Wipe: func(testing.TB) {
			s.mu.Lock()
			clear(s.locks)
			s.mu.Unlock()
		},
	})
}

func BenchmarkStore(b *testing.B) {
	s := New()
	locktest.Bench(b, locktest.Harness{
		New: func(testing.TB) locktest.Target { return locktest.Target{Backend: s} },
	})
}
