package pgstore

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// TestQueryExecModes runs every statement of the Store under each way pgx can send it (the
// pool's choice: PgBouncer users pick exec or simple_protocol), with names that need quoting.
func TestQueryExecModes(t *testing.T) {
	srv := startServer(t)
	modes := []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			pool := newPool(t, srv.pg.DSN, nil, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			st, ctx := New(pool, WithTable(srv.table)), t.Context()
			prefix := "mode:" + mode.String() + ":'\"\\%_{},é:"
			name, tok := prefix+"x'); DROP TABLE x; --", rand.Text()
			r := guard.Request{Name: name, Token: tok, TTL: time.Minute, Instance: "it's", Label: `a\b`, Value: "v'$1"}
			first, err := st.Acquire(ctx, r)
			require.NoError(t, err)
			again, err := st.Acquire(ctx, r)
			require.NoError(t, err)
			assert.Equal(t, first, again)
			var busy *guard.BusyError
			_, err = st.Acquire(ctx, guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute})
			require.ErrorAs(t, err, &busy)
			assert.Greater(t, busy.Remaining, 50*time.Second)
			errs := st.Extend(ctx, []guard.Lease{{Name: name, Token: tok, TTL: time.Hour}, {Name: name, Token: "x", TTL: time.Hour}})
			assert.NoError(t, errs[0])
			assert.ErrorIs(t, errs[1], guard.ErrNotHeld)
			info, err := st.Inspect(ctx, name)
			require.NoError(t, err)
			assert.Equal(t, guard.LockInfo{Name: name, Held: true, Fence: first, Instance: "it's", Label: `a\b`,
				Value: "v'$1", Holders: 1, AcquiredAt: info.AcquiredAt, Remaining: info.Remaining}, info)
			assert.Greater(t, info.Remaining, 59*time.Minute)
			page, next, err := st.List(ctx, prefix, "", 10)
			require.NoError(t, err)
			assert.Empty(t, next)
			require.Len(t, page, 1)
			assert.Equal(t, name, page[0].Name)
			n := make(notices, 4)
			sub, err := st.Subscribe(n.notify)
			require.NoError(t, err)
			defer sub.Close()
			require.NoError(t, sub.Watch(ctx, name))
			require.NoError(t, st.Release(ctx, name, tok, 0))
			assert.Equal(t, guard.Notice{Name: name, Token: tok}, n.next(t))
			require.ErrorIs(t, st.ForceRelease(ctx, name, 0), guard.ErrNotHeld)
		})
	}
}

// TestRoundTrips counts the exchanges of each operation on one connection: one each, and, the
// first time a statement runs on a connection, one more to prepare it (the pool's default
// mode caches prepared statements; Exec mode never prepares, and costs the server more).
func TestRoundTrips(t *testing.T) {
	srv := startServer(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			rt := &roundTrips{}
			pool := newPool(t, srv.pg.DSN, rt, func(c *pgxpool.Config) {
				c.MaxConns = 1
				c.ConnConfig.DefaultQueryExecMode = mode
			})
			st, ctx := New(pool, WithTable(srv.table)), t.Context()
			name := "rt:" + rand.Text()
			ops := []struct {
				op   string
				want error
				do   func(tok string) error
			}{
				{"acquire", nil, func(tok string) error {
					_, err := st.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Minute})
					return err
				}},
				{"busy acquire", guard.ErrNotAcquired, func(string) error {
					_, err := st.Acquire(ctx, guard.Request{Name: name, Token: "other", TTL: time.Minute})
					return err
				}},
				{"extend", nil, func(tok string) error {
					return st.Extend(ctx, []guard.Lease{{Name: name, Token: tok, TTL: time.Minute}})[0]
				}},
				{"release", nil, func(tok string) error { return st.Release(ctx, name, tok, 0) }},
			}
			for round := range 2 {
				tok := rand.Text()
				for _, op := range ops {
					n, p := rt.n.Load(), rt.prepares.Load()
					err := op.do(tok)
					if op.want == nil {
						require.NoError(t, err, op.op)
					} else {
						require.ErrorIs(t, err, op.want, op.op)
					}
					n, p = rt.n.Load()-n, rt.prepares.Load()-p
					t.Logf("round %d, %s: %d query, %d prepare", round, op.op, n, p)
					assert.EqualValues(t, 1, n, "%s: queries", op.op)
					wantPrepares := 0
					if round == 0 && mode == pgx.QueryExecModeCacheStatement && op.op != "busy acquire" {
						wantPrepares = 1 // the busy acquire runs the statement the acquire prepared
					}
					assert.EqualValues(t, wantPrepares, p, "%s: prepares", op.op)
				}
			}
		})
	}
}
