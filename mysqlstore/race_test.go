package mysqlstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// TestTakeoverRace lets racers, each a Store with a pool of its own and a connection open,
// ask for one name at the same moment, round after round: exactly one may win each round,
// and every other must get a busy answer carrying the winner's lease. An implementation that
// reads the row and then writes it lets several racers see the same expired lease and all
// take it; one atomic statement cannot.
//
// Expired: every round starts from a row whose lease ended (a crashed holder's).
// NewName: every round starts from a name without a row, so all racers insert at once.
// ReadThenWrite is the control: racers that SELECT the lease and then UPDATE the row, which
// must give some round several winners — or this test could not catch the bug it names.
func TestTakeoverRace(t *testing.T) {
	const (
		racers = 8
		rounds = 50
		ttl    = time.Minute
	)
	srv := startServer(t)
	stores := make([]*Store, racers)
	for i := range stores {
		stores[i], _ = srv.store(t)
	}
	expired := func(t *testing.T, name string) {
		_, err := srv.admin.ExecContext(t.Context(), `INSERT INTO guard_locks
			(name, token, fence, expires_at, acquired_at, instance, label)
			VALUES (?, 'crashed', 7, UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, 'crashed', '')`,
			name)
		require.NoError(t, err)
	}
	deadlocks := srv.deadlocks(t)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, name string)
	}{
		{"Expired", expired},
		{"NewName", func(*testing.T, string) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range rounds {
				name := fmt.Sprintf("race:%s:%d:%s", tc.name, round, rand.Text())
				tc.setup(t, name)
				winners := race(t, stores, name, (*Store).Acquire)
				require.Len(t, winners, 1, "round %d: winners", round)
				checkWinner(t, stores[0], name, winners[0], ttl)
			}
			t.Logf("%d rounds of %d racers: one winner each; InnoDB deadlocks (retried): %s", rounds, racers, deadlocks())
		})
	}
	t.Run("ReadThenWrite", func(t *testing.T) {
		for round := range rounds {
			name := fmt.Sprintf("race:naive:%d:%s", round, rand.Text())
			expired(t, name)
			if winners := race(t, stores, name, naiveAcquire); len(winners) > 1 {
				t.Logf("round %d: %d winners of %d racers", round, len(winners), racers)
				return
			}
		}
		t.Fatalf("read-then-write gave one winner in each of %d rounds: the race does not race", rounds)
	})
}

// acquireFunc is one acquire attempt by a racer.
type acquireFunc func(*Store, context.Context, guard.Request) (uint64, error)

// naiveAcquire is the bug the race test exists to catch: it reads the lease, and takes the
// row in a second statement when the lease it read had ended.
func naiveAcquire(s *Store, ctx context.Context, r guard.Request) (uint64, error) {
	var fence uint64
	var ended bool
	err := s.db.QueryRowContext(ctx, "SELECT fence, expires_at <= UTC_TIMESTAMP(6) FROM guard_locks WHERE name = ?", r.Name).
		Scan(&fence, &ended)
	if err != nil {
		return 0, err
	}
	if !ended {
		return 0, &guard.BusyError{Name: r.Name, Remaining: time.Minute}
	}
	// The token is part of the key now: a racer that changed it would move the row, and
	// racers would deadlock on the gaps instead of showing the bug. The lease is enough.
	_, err = s.db.ExecContext(ctx, "UPDATE guard_locks SET instance = ?, fence = ?, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE name = ?",
		r.Instance, fence+1, r.TTL.Microseconds(), r.Name)
	return fence + 1, err
}

// result is a racer's outcome.
type result struct {
	token string
	fence uint64
	err   error
}

// race lets every store try to take name at once, and returns the winners. Every other
// racer must have had a busy answer.
func race(t *testing.T, stores []*Store, name string, acquire acquireFunc) []result {
	t.Helper()
	const ttl = time.Minute
	var (
		start   = make(chan struct{})
		results = make([]result, len(stores))
		wg      sync.WaitGroup
	)
	for i, s := range stores {
		results[i].token = rand.Text()
		wg.Go(func() {
			<-start
			results[i].fence, results[i].err = acquire(s, context.Background(),
				guard.Request{Name: name, Token: results[i].token, TTL: ttl, Instance: fmt.Sprint("racer-", i)})
		})
	}
	close(start)
	wg.Wait()

	var winners []result
	for _, r := range results {
		var busy *guard.BusyError
		switch {
		case r.err == nil:
			winners = append(winners, r)
		case errors.As(r.err, &busy):
			// A statement reads the clock when it starts, before it waits for the row lock
			// that the winner holds: a loser that started first sees a little more than
			// the winner's whole lease left.
			assert.Greater(t, busy.Remaining, ttl-10*time.Second, "a busy answer without the winner's lease")
			assert.Less(t, busy.Remaining, ttl+time.Second)
		default:
			t.Errorf("%s: a racer failed: %v", name, r.err)
		}
	}
	return winners
}

// checkWinner checks that the row of name is the winner's.
func checkWinner(t *testing.T, s *Store, name string, winner result, ttl time.Duration) {
	t.Helper()
	info, err := s.Inspect(t.Context(), name)
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.Equal(t, winner.fence, info.Fence, "the row's fence is not the winner's")
	assert.Greater(t, winner.fence, uint64(7))
	assert.LessOrEqual(t, info.Remaining, ttl)
	// The winner's own retry finds its lock.
	again, err := s.Acquire(t.Context(), guard.Request{Name: name, Token: winner.token, TTL: ttl})
	require.NoError(t, err)
	assert.Equal(t, winner.fence, again)
}
