package memstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/locktest"
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
			delete(s.names, name)
			s.mu.Unlock()
		},
		Overwrite: func(_ testing.TB, name string) {
			s.mu.Lock()
			s.names[name] = &state{holders: []holder{{token: "intruder", expires: time.Now().Add(time.Hour)}}}
			s.mu.Unlock()
		},
		Wipe: func(testing.TB) {
			s.mu.Lock()
			clear(s.names)
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

// TestStateIsReclaimed: a service that locks one name per request must not grow the Store:
// a release forgets the name, and names whose lease ran out without a release are swept.
// Fences still increase per name: they come from one counter.
func TestStateIsReclaimed(t *testing.T) {
	s := New()
	now := time.Now()
	s.now = func() time.Time { return now }
	ctx := t.Context()
	var last uint64
	for i := range 100 {
		name := fmt.Sprint("request:", i)
		f, err := s.Acquire(ctx, guard.Request{Name: name, Token: "t", TTL: time.Second})
		require.NoError(t, err)
		require.Greater(t, f, last)
		last = f
		if i%2 == 0 {
			require.NoError(t, s.Release(ctx, name, "t", 0))
		}
	}
	assert.Len(t, s.names, 50, "released names are kept")
	now = now.Add(time.Minute) // the other half ran out, unreleased
	for range sweepEvery {
		f, err := s.Acquire(ctx, guard.Request{Name: "request:0", Token: "again", TTL: time.Second})
		require.NoError(t, err)
		require.Greater(t, f, last, "a forgotten name's fence went backwards")
		last = f
		require.NoError(t, s.Release(ctx, "request:0", "again", 0))
	}
	assert.Empty(t, s.names, "names whose lease ran out were never swept")
	assert.Equal(t, 1, s.sweeps)
}
