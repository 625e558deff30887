package pgstore

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/locktest"
)

// spelling is one way for a service to name a lock table: a WithTable name, and the
// search_path of its pool ("" for the server's default).
type spelling struct {
	table, searchPath string
}

// spellings creates, on s's server, a table in the default schema and one in a schema of its
// own, and returns pairs of spellings of each.
func (s *server) spellings(tb testing.TB) map[string][2]spelling {
	tb.Helper()
	suffix := strings.ToLower(rand.Text()[:8])
	public, schema := "spell_"+suffix, "ops_"+suffix
	_, err := s.admin.Exec(tb.Context(), "CREATE SCHEMA "+schema)
	require.NoError(tb, err)
	require.NoError(tb, New(s.admin, WithTable(public)).CreateTable(tb.Context()))
	require.NoError(tb, New(s.admin, WithTable(schema+".locks")).CreateTable(tb.Context()))
	quoted := `"Spell ` + suffix + `"`
	require.NoError(tb, New(s.admin, WithTable(quoted)).CreateTable(tb.Context()))
	long := `"` + strings.Repeat("l", 63-len(suffix)) + suffix + `"`
	require.NoError(tb, New(s.admin, WithTable(schema+"."+long)).CreateTable(tb.Context()))
	return map[string][2]spelling{
		"quoted table and public.quoted table": {{table: quoted}, {table: "public." + quoted}},
		"a channel name too long, hashed":      {{table: schema + "." + long}, {table: long, searchPath: schema + ",public"}},
		"table and schema.table":               {{table: public}, {table: "public." + public}},
		"table and SCHEMA.TABLE":               {{table: public}, {table: "PUBLIC." + strings.ToUpper(public)}},
		"schema.table and search_path+table":   {{table: schema + ".locks"}, {table: "locks", searchPath: schema}},
	}
}

// store returns a Store with a pool of its own that names its table as sp does.
func (s *server) storeAs(tb testing.TB, sp spelling) *Store {
	tb.Helper()
	pool := newPool(tb, s.pg.DSN, nil, func(c *pgxpool.Config) {
		if sp.searchPath != "" {
			c.ConnConfig.RuntimeParams["search_path"] = sp.searchPath
		}
	})
	return New(pool, WithTable(sp.table))
}

// TestOneChannelPerTable: stores that spell one table differently must hear each other's
// releases — one table, one notification channel.
func TestOneChannelPerTable(t *testing.T) {
	srv := startServer(t)
	for name, pair := range srv.spellings(t) {
		t.Run(name, func(t *testing.T) {
			for _, order := range [][2]spelling{pair, {pair[1], pair[0]}} {
				releaser, listener := srv.storeAs(t, order[0]), srv.storeAs(t, order[1])
				lock := "chan:" + rand.Text()
				_, n := subscribe(t, listener, lock)
				tok := take(t, releaser, lock)
				require.NoError(t, releaser.Release(t.Context(), lock, tok, 0))
				assert.Equal(t, guard.Notice{Name: lock, Token: tok}, n.next(t),
					"%+v did not hear a release by %+v", order[1], order[0])
				take(t, releaser, lock)
				require.NoError(t, releaser.ForceRelease(t.Context(), lock, 0))
				assert.Equal(t, guard.Notice{Name: lock}, n.next(t), "a forced release")
			}
		})
	}
}

// BenchmarkWakeUp measures how long after a release a Guard waiting in another service gets
// the name, when the two services spell the table alike and when they do not: the holder has a
// 6-second lease, which a waiter that hears no release sleeps out.
func BenchmarkWakeUp(b *testing.B) {
	srv := startServer(b)
	pairs := srv.spellings(b)
	pairs["same spelling"] = [2]spelling{pairs["table and schema.table"][0], pairs["table and schema.table"][0]}
	for _, name := range []string{"same spelling", "table and schema.table", "schema.table and search_path+table"} {
		pair := pairs[name]
		b.Run(name, func(b *testing.B) {
			holder := guard.New(srv.storeAs(b, pair[0]))
			spy := locktest.NewSpy(srv.storeAs(b, pair[1]), 64)
			waiter := guard.New(spy)
			b.Cleanup(func() {
				_ = holder.Close(context.Background())
				_ = waiter.Close(context.Background())
			})
			var total time.Duration
			for b.Loop() {
				lock := "wake:" + rand.Text()
				l, err := holder.TryAcquire(b.Context(), lock, guard.LeaseTime(6*time.Second))
				require.NoError(b, err)
				got := make(chan time.Time, 1)
				go func() {
					w, err := waiter.Acquire(b.Context(), lock, guard.WaitTime(time.Minute))
					got <- time.Now()
					if err == nil {
						_ = w.Release(context.Background())
					}
				}()
				<-spy.Busy() // parked
				released := time.Now()
				require.NoError(b, l.Release(b.Context()))
				total += (<-got).Sub(released)
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "wake-ms/op")
		})
	}
}

// TestFunctionsPerTable: stores that spell one table differently — and set it up in either
// order, each with CreateTable — run the same functions on the same table: each takes the
// name the other holds for no one, waits in one queue with the other, and is handed the name
// by the other's release. Before the functions named the table as the catalog does, the last
// CreateTable's spelling (an unqualified name) was resolved by the caller's search_path.
func TestFunctionsPerTable(t *testing.T) {
	srv := startServer(t)
	for name, pair := range srv.spellings(t) {
		t.Run(name, func(t *testing.T) {
			for _, order := range [][2]spelling{pair, {pair[1], pair[0]}} {
				first, second := srv.storeAs(t, order[0]), srv.storeAs(t, order[1])
				require.NoError(t, first.CreateTable(t.Context()))
				require.NoError(t, second.CreateTable(t.Context()))
				lock := "fn:" + rand.Text()
				tok := take(t, first, lock)
				_, n := subscribe(t, first, lock)
				waiter := guard.Request{Name: lock, Token: rand.Text(), TTL: time.Minute, Wait: true, Attempt: 1}
				_, err := second.Acquire(t.Context(), waiter)
				require.ErrorIs(t, err, guard.ErrNotAcquired, "%+v took a name %+v holds", order[1], order[0])
				require.NoError(t, first.Release(t.Context(), lock, tok, 0))
				assert.Equal(t, waiter.Token, n.next(t).Next, "the release by %+v did not hand over to %+v", order[0], order[1])
				require.NoError(t, second.Release(t.Context(), lock, waiter.Token, 0))
				n.next(t)
			}
		})
	}
}
