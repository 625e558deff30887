package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/etcdstore"
	"github.com/guardlock/guard/redisstore"
)

// fault stands between a store and its server, and does to one request what a network and a
// client do to it at the worst moments. Its hooks run in the request's goroutine.
type fault struct {
	// afterRead, when set, runs after the store's read of the balance.
	afterRead func()
	// write sends the store's write with send, which makes it on the server whatever ctx says
	// meanwhile, and returns what the store's client would answer; ctx is the context the
	// store gave the write. nil: send it and return its error.
	write func(ctx context.Context, send func() error) error
}

func (f *fault) read() {
	if f.afterRead != nil {
		f.afterRead()
	}
}

func (f *fault) send(ctx context.Context, send func() error) error {
	if ctx.Err() != nil { // a client sends nothing under a context that has ended
		return ctx.Err()
	}
	if f.write == nil {
		return send()
	}
	return f.write(ctx, send)
}

// faultKV is the etcd KV of an EtcdStore with a fault between it and the server.
type faultKV struct {
	clientv3.KV
	f *fault
}

func (k faultKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	k.f.read()
	return resp, err
}

func (k faultKV) Txn(ctx context.Context) clientv3.Txn {
	return &faultTxn{Txn: k.KV.Txn(context.WithoutCancel(ctx)), ctx: ctx, f: k.f}
}

type faultTxn struct {
	clientv3.Txn
	ctx context.Context
	f   *fault
}

func (t *faultTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *faultTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *faultTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *faultTxn) Commit() (*clientv3.TxnResponse, error) {
	var resp *clientv3.TxnResponse
	err := t.f.send(t.ctx, func() (err error) {
		resp, err = t.Txn.Commit()
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// faultHook puts a fault between a RedisStore's client and its server: the read is HMGET,
// the write the commit script.
type faultHook struct{ f *fault }

func (faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "hmget":
			err := next(ctx, cmd)
			h.f.read()
			return err
		case "evalsha", "eval":
			err := h.f.send(ctx, func() error { return next(context.WithoutCancel(ctx), cmd) })
			if err != nil {
				cmd.SetErr(err)
			}
			return err
		}
		return next(ctx, cmd)
	}
}

var errReplyLost = errors.New("test: the reply to the write was lost")

// A deposit answers what happened to it when its request ends, or its reply is lost, around
// its write: nothing was written when the request ended before the write was sent; the write
// is made and answered when the request ends while it is in flight (the fence, not the
// request's context, keeps a holder that lost its lock from writing over a newer one); and
// when the write was sent but no reply came, the answer says the outcome is unknown — never
// "nothing was written", or "try again", which would deposit twice.
func TestAnswerAroundTheWrite(t *testing.T) {
	stores := []struct {
		name string
		open func(t *testing.T, f *fault) (guard.Backend, Store)
	}{
		{"redis", func(t *testing.T, f *fault) (guard.Backend, Store) {
			addr := startRedis(t)
			locks, data := redis.NewClient(&redis.Options{Addr: addr}), redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { _ = locks.Close(); _ = data.Close() })
			data.AddHook(faultHook{f})
			return redisstore.New(locks), NewRedisStore(data)
		}},
		{"etcd", func(t *testing.T, f *fault) (guard.Backend, Store) {
			client, err := clientv3.New(clientv3.Config{Endpoints: []string{startEtcd(t)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			require.NoError(t, err)
			backend := etcdstore.New(client)
			t.Cleanup(func() {
				assert.NoError(t, backend.Close())
				assert.NoError(t, client.Close())
			})
			return backend, NewEtcdStore(faultKV{KV: client, f: f})
		}},
	}
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			f := &fault{}
			backend, store := s.open(t, f)
			g := guard.New(backend)
			t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
			h := NewHandler(g, store)

			var cancel context.CancelFunc // the request's
			tests := []struct {
				name    string
				fault   fault
				status  int
				detail  string
				applied bool
			}{
				{"request ends before the write", fault{afterRead: func() { cancel() }},
					http.StatusServiceUnavailable, "nothing was written", false},
				{"request ends while the write is in flight", fault{write: func(ctx context.Context, send func() error) error {
					err := send()
					cancel()
					if ctx.Err() != nil { // the reply came after the context ended
						return ctx.Err()
					}
					return err
				}}, http.StatusOK, "", true},
				{"reply lost", fault{write: func(_ context.Context, send func() error) error {
					require.NoError(t, send())
					return errReplyLost
				}}, http.StatusServiceUnavailable, "outcome is unknown", true},
			}
			for i, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					id := string(rune('a' + i))
					*f = fault{}
					_, err := store.Update(t.Context(), Account{Tenant: "acme", ID: id}, 1, func(int64) (int64, error) { return 100, nil })
					require.NoError(t, err)

					*f = tt.fault
					t.Cleanup(func() { *f = fault{} })
					var ctx context.Context
					ctx, cancel = context.WithCancel(t.Context())
					defer cancel()
					req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/accounts/"+id+"/deposit", strings.NewReader(`{"amount": 88}`))
					req.Header.Set(TenantHeader, "acme")
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)

					*f = fault{}
					balance, _, err := store.Balance(t.Context(), Account{Tenant: "acme", ID: id})
					require.NoError(t, err)
					want := int64(100)
					if tt.applied {
						want += 88
					}
					assert.Equal(t, want, balance, "balance after the deposit")
					require.Equal(t, tt.status, rec.Code, "%s", rec.Body)
					assert.Contains(t, rec.Body.String(), tt.detail)
				})
			}
		})
	}
}
