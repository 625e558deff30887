package bench

// The whole-Guard half of the rueidis trial (issue 21): a Guard on a trial backend that sends
// redisstore's scripts, keys and arguments over rueidis, beside a Guard on redisstore, so that
// the gain a rueidis store would bring is measured through guard's own code rather than
// estimated from the scripts alone. The backend does what TryAcquire, a watchdog and Release
// need — exclusive locks, renewals, releases that may hand the name over — and no more: no
// waiting (no Notifier), no shared holds, no Inspector, no Cluster partitions. It is a
// measuring instrument, not a store.

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/redisstore"
)

type rueidisTrialBackend struct {
	c       rueidis.Client
	scripts *rueidisScripts
	extend  string // extend.lua's source, for NOSCRIPT
	// keys caches names' keys as redisstore's keyCache does (redisstore/call.go): 64 places,
	// a name's keys replaced by any other name's that hashes to its place.
	seed maphash.Seed
	keys [64]atomic.Pointer[scriptLock]
}

// keysOf returns name's keys, from the cache when they are there.
func (b *rueidisTrialBackend) keysOf(name string) *scriptLock {
	e := &b.keys[maphash.String(b.seed, name)&uint64(len(b.keys)-1)]
	if l := e.Load(); l != nil && l.name == name {
		return l
	}
	l := scriptKeys(name)
	e.Store(l)
	return l
}

var _ guard.Backend = (*rueidisTrialBackend)(nil)

func newRueidisTrialBackend(tb testing.TB, addr string) *rueidisTrialBackend {
	src := loadStoreScripts(tb)
	sc := openRueidis(tb, addr, src, rueidis.ClientOption{}).(*rueidisScripts)
	return &rueidisTrialBackend{c: sc.c, scripts: sc, extend: src.extend, seed: maphash.MakeSeed()}
}

// ms is d in whole milliseconds, rounded up, as redisstore sends leases.
func ms(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)
}

func (b *rueidisTrialBackend) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if r.Wait || r.Shared {
		return 0, errors.New("rueidis trial: only exclusive TryAcquire")
	}
	l := b.keysOf(r.Name)
	vals, err := b.scripts.evalsha(ctx, b.scripts.acquire, b.scripts.acquireSrc, l.keys,
		r.Token, ms(r.TTL), r.Instance, r.Label, retentionStr, "0", strconv.Itoa(r.Attempt), r.Value, "-1").ToArray()
	if err != nil {
		return 0, err
	}
	first, _ := vals[0].AsInt64()
	switch {
	case len(vals) == 2 && first == 1:
		if fence, err := vals[1].AsInt64(); err == nil && fence > 0 {
			return uint64(fence), nil
		}
		s, err := vals[1].ToString()
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(s, 10, 64)
	case len(vals) == 3 && first == 0:
		pttl, _ := vals[1].AsInt64()
		queued, _ := vals[2].AsInt64()
		return 0, &guard.BusyError{Name: r.Name, Remaining: max(time.Duration(pttl)*time.Millisecond, 0),
			Queued: time.Duration(queued) * time.Millisecond}
	}
	return 0, fmt.Errorf("rueidis trial: acquire answered %v", vals)
}

func (b *rueidisTrialBackend) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := make([]error, len(leases))
	type call struct{ from, to int }
	var calls []call
	cmds := make(rueidis.Commands, 0, (len(leases)+extendChunk-1)/extendChunk)
	for from := 0; from < len(leases); from += extendChunk {
		to := min(from+extendChunk, len(leases))
		keys := make([]string, 0, 4*(to-from))
		args := make([]string, 1, 1+2*(to-from))
		args[0] = retentionStr
		for _, l := range leases[from:to] {
			keys = append(keys, b.keysOf(l.Name).extend...)
			args = append(args, l.Token, ms(l.TTL))
		}
		calls = append(calls, call{from, to})
		cmds = append(cmds, b.c.B().Evalsha().Sha1(b.scripts.extendSHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	for i, res := range b.c.DoMulti(ctx, cmds...) {
		c := calls[i]
		vals, err := res.AsIntSlice()
		for j := c.from; j < c.to; j++ {
			switch {
			case err != nil:
				errs[j] = err
			case vals[j-c.from] == 1:
			default:
				errs[j] = guard.ErrNotHeld
			}
		}
	}
	return errs
}

func (b *rueidisTrialBackend) Release(ctx context.Context, name, token string, keep time.Duration) error {
	l := b.keysOf(name)
	keepArg := "0"
	if keep > 0 {
		keepArg = ms(keep)
	}
	res := b.scripts.evalsha(ctx, b.scripts.release, b.scripts.releaseSrc, l.keys, token, keepArg, l.channel, retentionStr)
	if n, err := res.AsInt64(); err == nil {
		if n == 0 {
			return guard.ErrNotHeld
		}
		return nil
	}
	if _, err := res.ToArray(); err != nil {
		return err
	}
	return nil // handed over to a waiter (there are none in these runs)
}

// rueidisGuardLib is a Guard on the trial backend, as a lib of compare_test.go.
func rueidisGuardLib(tb testing.TB, addr string) locker {
	g := guard.New(newRueidisTrialBackend(tb, addr), guard.WithWatchdogTimeout(ttl))
	tb.Cleanup(func() { _ = g.Close(context.Background()) })
	return func(ctx context.Context, name string, wait bool) (func() error, error) {
		if wait {
			return nil, errors.New("rueidis trial: TryAcquire only")
		}
		l, err := g.TryAcquire(ctx, name)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
}

// BenchmarkGuardOnRueidis compares a whole Guard on redisstore (go-redis) with a Guard on the
// rueidis trial backend: an uncontended TryAcquire+Release from one goroutine (P1), and
// TryAcquire+Release of distinct names from 16 and 64 goroutines (throughput and the process's
// CPU per op), the cases in which the scripts alone ran 1.9–2.2× faster on rueidis.
func BenchmarkGuardOnRueidis(b *testing.B) {
	srv := testserver.StartRedis(b)
	kinds := []struct {
		name string
		open func(tb testing.TB) locker
	}{
		{"redisstore", func(tb testing.TB) locker {
			client := redis.NewClient(&redis.Options{Addr: srv.Addr})
			tb.Cleanup(func() { _ = client.Close() })
			return libs[0].open(tb, client)
		}},
		// go-redis with a connection for each goroutine: its default pool (10 a CPU, 20
		// here) makes 64 goroutines queue for connections, which rueidis multiplexes.
		{"redisstore-pool64", func(tb testing.TB) locker {
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
			tb.Cleanup(func() { _ = client.Close() })
			return libs[0].open(tb, client)
		}},
		// Each call on a connection of its own, as redisstore sent them before it batched
		// concurrent calls (redisstore.WithPipelines).
		{"redisstore-unbatched-pool64", func(tb testing.TB) locker {
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
			tb.Cleanup(func() { _ = client.Close() })
			g := guard.New(redisstore.New(client, redisstore.WithPipelines(0)), guard.WithWatchdogTimeout(ttl))
			tb.Cleanup(func() { _ = g.Close(context.Background()) })
			return guardLocker(g)
		}},
		{"rueidis", func(tb testing.TB) locker { return rueidisGuardLib(tb, srv.Addr) }},
	}
	for _, workers := range []int{1, 4, 16, 64} {
		for _, k := range kinds {
			b.Run(fmt.Sprintf("goroutines=%d/%s", workers, k.name), func(b *testing.B) {
				lock := k.open(b)
				names := make([]string, workers)
				for i := range names {
					names[i] = fmt.Sprintf("bench:rg:%s:%d", k.name, i)
				}
				runConcurrent(b, workers, func(ctx context.Context, i int) error {
					unlock, err := lock(ctx, names[i], false)
					if err != nil {
						return err
					}
					return unlock()
				})
			})
		}
	}
}
