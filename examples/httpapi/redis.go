package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// RedisStore keeps the balances on a Redis server — the one the locks are on: a hash per
// account, with its balance and the highest fence accepted, under the key "httpapi:account:"
// and the tenant and the ID as a JSON array (so that no tenant and ID spell another pair's
// key). A write is one script that checks the fence (commit.lua).
type RedisStore struct {
	client redis.Cmdable
}

// NewRedisStore returns a Store on client's server.
func NewRedisStore(client redis.Cmdable) *RedisStore { return &RedisStore{client: client} }

//go:embed commit.lua
var commitLua string

var commitScript = redis.NewScript(commitLua)

func redisKey(a Account) string {
	b, _ := json.Marshal([]string{a.Tenant, a.ID}) // strings always marshal
	return "httpapi:account:" + string(b)
}

// Balance implements Store.
func (s *RedisStore) Balance(ctx context.Context, a Account) (int64, uint64, error) {
	vals, err := s.client.HMGet(ctx, redisKey(a), "balance", "fence").Result()
	if err != nil {
		return 0, 0, err
	}
	var balance int64
	var fence uint64
	if v, ok := vals[0].(string); ok {
		if balance, err = strconv.ParseInt(v, 10, 64); err != nil {
			return 0, 0, err
		}
	}
	if v, ok := vals[1].(string); ok {
		if fence, err = strconv.ParseUint(v, 10, 64); err != nil {
			return 0, 0, err
		}
	}
	return balance, fence, nil
}

// Update implements Store.
func (s *RedisStore) Update(ctx context.Context, a Account, fence uint64, change func(int64) (int64, error)) (int64, error) {
	balance, _, err := prepare(ctx, s, a, fence, change)
	if err != nil {
		return 0, err
	}
	var higher string
	err = write(ctx, func(ctx context.Context) (err error) {
		higher, err = commitScript.Run(ctx, s.client, []string{redisKey(a)}, balance, strconv.FormatUint(fence, 10)).Text()
		return err
	})
	switch {
	case err != nil:
		return 0, err
	case higher == "":
		return balance, nil
	}
	seen, err := strconv.ParseUint(higher, 10, 64)
	return 0, errors.Join(staleFence(a, fence, seen), err)
}
