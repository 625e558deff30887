package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/examples/grpcapi/bankpb"
)

// accounts is the service. Its handlers hold no lock of their own: the interceptors took the
// account's lock before they run, and the lock's fence is in their context.
type accounts struct {
	bankpb.UnimplementedAccountsServer
	store balances
	work  time.Duration // the time a change takes between its read and its write
}

func (a *accounts) Deposit(ctx context.Context, r *bankpb.MoveRequest) (*bankpb.BalanceReply, error) {
	return a.move(ctx, r.GetAccountId(), r.GetAmount())
}

func (a *accounts) Withdraw(ctx context.Context, r *bankpb.MoveRequest) (*bankpb.BalanceReply, error) {
	return a.move(ctx, r.GetAccountId(), -r.GetAmount())
}

// move reads the balance, works, and writes the new one under the lock's fence.
func (a *accounts) move(ctx context.Context, id string, delta int64) (*bankpb.BalanceReply, error) {
	if delta == 0 {
		return nil, status.Error(codes.InvalidArgument, "amount must not be zero")
	}
	l, ok := guard.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no lock: the interceptors are not installed")
	}
	balance, err := a.store.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if balance+delta < 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "balance %d is less than %d", balance, -delta)
	}
	select {
	case <-time.After(a.work):
	case <-ctx.Done():
		return nil, context.Cause(ctx) // the lock was lost: write nothing
	}
	if err := a.store.set(ctx, id, balance+delta, l.Fence()); err != nil {
		return nil, err
	}
	return &bankpb.BalanceReply{AccountId: id, Balance: balance + delta, Fence: l.Fence()}, nil
}

func (a *accounts) Get(ctx context.Context, r *bankpb.GetRequest) (*bankpb.BalanceReply, error) {
	b, err := a.store.get(ctx, r.GetAccountId())
	if err != nil {
		return nil, err
	}
	return &bankpb.BalanceReply{AccountId: r.GetAccountId(), Balance: b}, nil
}

func (a *accounts) Export(_ *bankpb.ExportRequest, stream grpc.ServerStreamingServer[bankpb.Line]) error {
	all, err := a.store.all(stream.Context())
	if err != nil {
		return err
	}
	for _, id := range slices.Sorted(maps.Keys(all)) {
		if err := stream.Send(&bankpb.Line{AccountId: id, Balance: all[id]}); err != nil {
			return err
		}
	}
	return nil
}

// errStale is a write under a fence older than the account's last: its lock was lost, and
// another holder wrote since.
var errStale = status.Error(codes.Aborted, "the account changed under a newer lock; this change was not written")

// balances keeps the accounts' balances, each written with the fence it was written under.
type balances interface {
	get(ctx context.Context, id string) (int64, error)
	// set writes balance unless the account was written under a fence newer than fence.
	set(ctx context.Context, id string, balance int64, fence uint64) error
	all(ctx context.Context) (map[string]int64, error)
}

// memBalances are the balances of one process.
type memBalances struct {
	mu     sync.Mutex
	amount map[string]int64
	fence  map[string]uint64
}

func newMemBalances() *memBalances {
	return &memBalances{amount: make(map[string]int64), fence: make(map[string]uint64)}
}

func (m *memBalances) get(_ context.Context, id string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.amount[id], nil
}

func (m *memBalances) set(_ context.Context, id string, balance int64, fence uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if fence < m.fence[id] {
		return errStale
	}
	m.amount[id], m.fence[id] = balance, fence
	return nil
}

func (m *memBalances) all(context.Context) (map[string]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.amount), nil
}

// redisBalances keep each account in a hash, grpcapi:account:ID, with its balance and fence;
// the set grpcapi:accounts lists them.
type redisBalances struct{ rdb *redis.Client }

// fencedSet writes the balance unless the hash holds a newer fence.
var fencedSet = redis.NewScript(`
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[2]) < last then return 0 end
redis.call('HSET', KEYS[1], 'balance', ARGV[1], 'fence', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return 1`)

func accountKey(id string) string { return "grpcapi:account:" + id }

func (r *redisBalances) get(ctx context.Context, id string) (int64, error) {
	s, err := r.rdb.HGet(ctx, accountKey(id), "balance").Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, status.Errorf(codes.Unavailable, "balances: %v", err)
	}
	return strconv.ParseInt(s, 10, 64)
}

func (r *redisBalances) set(ctx context.Context, id string, balance int64, fence uint64) error {
	ok, err := fencedSet.Run(ctx, r.rdb, []string{accountKey(id), "grpcapi:accounts"}, balance, fence, id).Int()
	if err != nil {
		return status.Errorf(codes.Unavailable, "balances: %v", err)
	}
	if ok == 0 {
		return errStale
	}
	return nil
}

func (r *redisBalances) all(ctx context.Context) (map[string]int64, error) {
	ids, err := r.rdb.SMembers(ctx, "grpcapi:accounts").Result()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "balances: %v", err)
	}
	out := make(map[string]int64, len(ids))
	for _, id := range ids {
		b, err := r.get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("account %s: %w", id, err)
		}
		out[id] = b
	}
	return out, nil
}
