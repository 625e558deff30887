package bench

// The rueidis trial (issue 21): what a Redis store on github.com/redis/rueidis could gain over
// go-redis at most. Both clients send redisstore's own scripts, read from ../redisstore, with
// the keys and arguments the Store passes (see redisstore.go and extend.go): the share of the
// work that would change with the client — building, sending and reading the commands, boxing
// the arguments — is timed; the lock keys and the tokens, the same for either client, are built
// once ahead. Every reply is checked, so that each operation does the script's real work.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/guardlock/guard/internal/testserver"
)

// storeScripts are the sources of redisstore's scripts as the Store sends them: acquire.lua
// and release.lua after lock.lua, extend.lua alone.
type storeScripts struct{ acquire, release, extend string }

func loadStoreScripts(tb testing.TB) storeScripts {
	tb.Helper()
	read := func(name string) string {
		src, err := os.ReadFile(filepath.Join("..", "redisstore", name))
		if err != nil {
			tb.Fatal(err)
		}
		return string(src)
	}
	lock := read("lock.lua")
	return storeScripts{acquire: lock + read("acquire.lua"), release: lock + read("release.lua"),
		extend: read("extend.lua")}
}

// The arguments of an uncontended exclusive TryAcquire by a Guard with a 30 s watchdog, and of
// its release, as redisstore passes them: the lease and the fence retention in milliseconds,
// no place in the queue (0), the first attempt (1), no label or value, an exclusive hold (-1),
// no MinHold window (0). The Store boxes the integers once; a store on rueidis would keep them
// as strings.
const (
	scriptPrefix    = "guard:"
	scriptTTL       = int64(30000)
	scriptRetention = int64(60000)
	extendChunk     = 256 // leases per extend.lua, as the Store
	extendCalls     = 16  // extend.lua calls per pipeline: 4096 renewals
)

var (
	ttlAny, retentionAny, zeroAny, exclusiveAny any = scriptTTL, scriptRetention, int64(0), int64(-1)
	instanceAny, emptyAny                       any = scriptInstance, ""
	ttlStr, retentionStr                            = strconv.FormatInt(scriptTTL, 10), strconv.FormatInt(scriptRetention, 10)
	scriptInstance                                  = func() string {
		host, _ := os.Hostname()
		return host + ":" + strconv.Itoa(os.Getpid())
	}()
)

// scriptLock is one name's keys as the Store sends them, and a token.
type scriptLock struct {
	name    string
	keys    []string // lock, fence, queue, waiters, shared, holders
	channel string   // the release channel
	extend  []string // extend.lua's keys: lock, fence, shared, holders
	token   string
}

func newScriptLock(name string, i int) *scriptLock {
	l := scriptKeys(name)
	l.token = fmt.Sprintf("%026d", i) // 26 characters, as guard's tokens
	return l
}

// scriptKeys returns name's keys, with no token.
func scriptKeys(name string) *scriptLock {
	base := scriptPrefix + "{" + name + "}"
	l := &scriptLock{name: name, channel: base + ":released"}
	for _, s := range []string{"", ":fence", ":queue", ":waiters", ":shared", ":holders"} {
		l.keys = append(l.keys, base+s)
	}
	l.extend = []string{l.keys[0], l.keys[1], l.keys[4], l.keys[5]}
	return l
}

// scriptClient runs the Store's scripts on one client library.
type scriptClient interface {
	// acquireRelease takes l and gives it back: acquire.lua, then release.lua.
	acquireRelease(ctx context.Context, l *scriptLock) error
	// extend renews every lock of locks, extendChunk per extend.lua, in one pipeline.
	extend(ctx context.Context, locks []*scriptLock) error
}

// goredisScripts sends the scripts as redisstore does: redis.Script.Run, EVALSHA then EVAL on
// NOSCRIPT; Pipelined for extend.lua.
type goredisScripts struct {
	c                              *redis.Client
	acquire, release, extendScript *redis.Script
}

func (g *goredisScripts) acquireRelease(ctx context.Context, l *scriptLock) error {
	reply, err := g.acquire.Run(ctx, g.c, l.keys, l.token, ttlAny, instanceAny, emptyAny,
		retentionAny, zeroAny, 1, emptyAny, exclusiveAny).Result()
	if err != nil {
		return err
	}
	if vals, _ := reply.([]any); len(vals) != 2 || vals[0] != int64(1) {
		return fmt.Errorf("acquire: %v", reply)
	}
	args := []any{l.token, zeroAny, l.channel, retentionAny}
	n, err := g.release.Run(ctx, g.c, l.keys, args...).Result()
	if err != nil {
		return err
	}
	if n != int64(1) {
		return fmt.Errorf("release: %v", n)
	}
	return nil
}

func (g *goredisScripts) extend(ctx context.Context, locks []*scriptLock) error {
	cmds := make([]*redis.Cmd, 0, (len(locks)+extendChunk-1)/extendChunk)
	_, _ = g.c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for chunk := range slices.Chunk(locks, extendChunk) {
			keys := make([]string, 0, 4*len(chunk))
			args := make([]any, 1, 1+2*len(chunk))
			args[0] = retentionAny
			for _, l := range chunk {
				keys = append(keys, l.extend...)
				args = append(args, l.token, ttlAny)
			}
			cmds = append(cmds, g.extendScript.EvalSha(ctx, pipe, keys, args...))
		}
		return nil
	})
	for _, c := range cmds {
		vals, err := c.Slice()
		if err != nil {
			return err
		}
		for _, v := range vals {
			if v != int64(1) {
				return fmt.Errorf("extend: %v", v)
			}
		}
	}
	return nil
}

// rueidisScripts sends the same scripts on rueidis: EVALSHA through Client.Do (auto-pipelined
// unless the client disables it), DoMulti for extend.lua.
type rueidisScripts struct {
	c                           rueidis.Client
	acquire, release, extendSHA string // the scripts' SHA1s
	acquireSrc, releaseSrc      string
}

// evalsha runs the script sha (source src) on keys and args: EVALSHA, then EVAL on NOSCRIPT.
func (r *rueidisScripts) evalsha(ctx context.Context, sha, src string, keys []string, args ...string) rueidis.RedisResult {
	res := r.c.Do(ctx, r.c.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if e, ok := rueidis.IsRedisErr(res.Error()); ok && e.IsNoScript() {
		res = r.c.Do(ctx, r.c.B().Eval().Script(src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return res
}

func (r *rueidisScripts) acquireRelease(ctx context.Context, l *scriptLock) error {
	vals, err := r.evalsha(ctx, r.acquire, r.acquireSrc, l.keys, l.token, ttlStr, scriptInstance, "",
		retentionStr, "0", strconv.Itoa(1), "", "-1").ToArray()
	if err != nil {
		return err
	}
	if len(vals) != 2 {
		return fmt.Errorf("acquire: %d values", len(vals))
	}
	if ok, err := vals[0].AsInt64(); err != nil || ok != 1 {
		return fmt.Errorf("acquire: %v %v", ok, err)
	}
	if fence, err := vals[1].AsInt64(); err != nil || fence <= 0 {
		return fmt.Errorf("acquire: fence %v %v", fence, err)
	}
	n, err := r.evalsha(ctx, r.release, r.releaseSrc, l.keys, l.token, "0", l.channel, retentionStr).AsInt64()
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("release: %d", n)
	}
	return nil
}

func (r *rueidisScripts) extend(ctx context.Context, locks []*scriptLock) error {
	cmds := make(rueidis.Commands, 0, (len(locks)+extendChunk-1)/extendChunk)
	for chunk := range slices.Chunk(locks, extendChunk) {
		keys := make([]string, 0, 4*len(chunk))
		args := make([]string, 1, 1+2*len(chunk))
		args[0] = retentionStr
		for _, l := range chunk {
			keys = append(keys, l.extend...)
			args = append(args, l.token, ttlStr)
		}
		cmds = append(cmds, r.c.B().Evalsha().Sha1(r.extendSHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	for _, res := range r.c.DoMulti(ctx, cmds...) {
		vals, err := res.AsIntSlice()
		if err != nil {
			return err
		}
		for _, v := range vals {
			if v != 1 {
				return fmt.Errorf("extend: %d", v)
			}
		}
	}
	return nil
}

// scriptClientKind makes one client under comparison on the server at addr.
type scriptClientKind struct {
	name string
	open func(tb testing.TB, addr string, src storeScripts) scriptClient
}

func openRueidis(tb testing.TB, addr string, src storeScripts, opt rueidis.ClientOption) scriptClient {
	tb.Helper()
	opt.InitAddress = []string{addr}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	load := func(src string) string {
		sha, err := c.Do(context.Background(), c.B().ScriptLoad().Script(src).Build()).ToString()
		if err != nil {
			tb.Fatal(err)
		}
		return sha
	}
	return &rueidisScripts{c: c, acquire: load(src.acquire), release: load(src.release),
		extendSHA: load(src.extend), acquireSrc: src.acquire, releaseSrc: src.release}
}

var (
	goredisKind = scriptClientKind{"go-redis", func(tb testing.TB, addr string, src storeScripts) scriptClient {
		c := redis.NewClient(&redis.Options{Addr: addr})
		tb.Cleanup(func() { _ = c.Close() })
		g := &goredisScripts{c: c, acquire: redis.NewScript(src.acquire),
			release: redis.NewScript(src.release), extendScript: redis.NewScript(src.extend)}
		for _, s := range []*redis.Script{g.acquire, g.release, g.extendScript} {
			if err := s.Load(context.Background(), c).Err(); err != nil {
				tb.Fatal(err)
			}
		}
		return g
	}}
	// rueidis with its defaults: auto-pipelining (a Do that finds the pipe busy joins it).
	rueidisKind = scriptClientKind{"rueidis", func(tb testing.TB, addr string, src storeScripts) scriptClient {
		return openRueidis(tb, addr, src, rueidis.ClientOption{})
	}}
	// rueidis with DisableAutoPipelining: each Do on a pooled connection of its own, as
	// go-redis does.
	rueidisPooledKind = scriptClientKind{"rueidis-pooled", func(tb testing.TB, addr string, src storeScripts) scriptClient {
		return openRueidis(tb, addr, src, rueidis.ClientOption{DisableAutoPipelining: true})
	}}
)

// BenchmarkClientScriptsUncontended (P1-like) takes and releases one free name from one
// goroutine: acquire.lua then release.lua, as a Guard's TryAcquire and Release send them.
func BenchmarkClientScriptsUncontended(b *testing.B) {
	srv := testserver.StartRedis(b)
	src := loadStoreScripts(b)
	for _, k := range []scriptClientKind{goredisKind, rueidisKind, rueidisPooledKind} {
		b.Run(k.name, func(b *testing.B) {
			c := k.open(b, srv.Addr, src)
			l := newScriptLock("bench:p1:"+k.name, 0)
			ctx := context.Background()
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			for range b.N {
				if err := c.acquireRelease(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkClientScriptsConcurrent (P2-like) takes and releases distinct names from 16 and 64
// goroutines at once (one name each): where auto-pipelining can gather commands. An op is one
// acquire+release; ops/s is the total throughput. "guard" is a whole Guard on redisstore
// (go-redis) doing the same, TryAcquire then Release: how much of its cost the client's share is.
func BenchmarkClientScriptsConcurrent(b *testing.B) {
	srv := testserver.StartRedis(b)
	src := loadStoreScripts(b)
	for _, workers := range []int{16, 64} {
		for _, k := range []scriptClientKind{goredisKind, rueidisKind, rueidisPooledKind} {
			b.Run(fmt.Sprintf("goroutines=%d/%s", workers, k.name), func(b *testing.B) {
				c := k.open(b, srv.Addr, src)
				locks := make([]*scriptLock, workers)
				for i := range locks {
					locks[i] = newScriptLock(fmt.Sprintf("bench:p2:%s:%d", k.name, i), i)
				}
				runConcurrent(b, workers, func(ctx context.Context, i int) error {
					return c.acquireRelease(ctx, locks[i])
				})
			})
		}
		b.Run(fmt.Sprintf("goroutines=%d/guard", workers), func(b *testing.B) {
			client, _ := newClient(b, srv.Addr)
			lock := libs[0].open(b, client)
			names := make([]string, workers)
			for i := range names {
				names[i] = fmt.Sprintf("bench:p2:guard:%d", i)
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

// runConcurrent runs op b.N times in all from workers goroutines, goroutine i calling op(ctx, i),
// and reports the throughput and the process's CPU per op.
func runConcurrent(b *testing.B, workers int, op func(ctx context.Context, i int) error) {
	ctx := context.Background()
	var next atomic.Int64
	var failed atomic.Pointer[error]
	b.ReportAllocs()
	cpu := cpuTime()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(ctx, i); err != nil {
					failed.Store(&err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkClientScriptsExtend (P4-like) renews 4096 held locks as the Store's Extend does: 16
// extend.lua calls of 256 leases each, in one pipeline. An op is the whole pipeline.
func BenchmarkClientScriptsExtend(b *testing.B) {
	srv := testserver.StartRedis(b)
	src := loadStoreScripts(b)
	const held = extendCalls * extendChunk
	locks := make([]*scriptLock, held)
	for i := range locks {
		locks[i] = newScriptLock("bench:p4:"+strconv.Itoa(i), i)
	}
	setup := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = setup.Close() })
	acquire := redis.NewScript(src.acquire)
	if err := acquire.Load(context.Background(), setup).Err(); err != nil {
		b.Fatal(err) // a pipeline sends EVALSHA only
	}
	for _, k := range []scriptClientKind{goredisKind, rueidisKind} {
		b.Run(k.name, func(b *testing.B) {
			ctx := context.Background()
			// Take (or take again, with a fresh lease) every lock, so that extend.lua finds
			// each held by its token.
			cmds, _ := setup.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				for _, l := range locks {
					acquire.Run(ctx, pipe, l.keys, l.token, ttlAny, instanceAny, emptyAny,
						retentionAny, zeroAny, 1, emptyAny, exclusiveAny)
				}
				return nil
			})
			for _, c := range cmds {
				if vals, err := c.(*redis.Cmd).Slice(); err != nil || len(vals) != 2 || vals[0] != int64(1) {
					b.Fatalf("acquire: %v %v", vals, err)
				}
			}
			c := k.open(b, srv.Addr, src)
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			for range b.N {
				if err := c.extend(ctx, locks); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cpuPer := float64(cpuTime()-cpu) / float64(b.N*held)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*held), "ns/renewal")
			b.ReportMetric(cpuPer, "cpu-ns/renewal")
		})
	}
}

// rueidislockLib is rueidislock as a lib of compare_test.go: majority keys of 2*majority-1
// (its default is 2 of 3; 1 is a single key, as redislock's).
func rueidislockLib(name string, majority int32) lib {
	return lib{name, func(tb testing.TB, client *redis.Client) locker {
		l, err := rueidislock.NewLocker(rueidislock.LockerOption{
			ClientOption: rueidis.ClientOption{InitAddress: []string{client.Options().Addr}},
			KeyValidity:  ttl, KeyMajority: majority,
		})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(l.Close)
		return func(ctx context.Context, name string, wait bool) (func() error, error) {
			lock := l.TryWithContext
			if wait {
				lock = l.WithContext
			}
			_, cancel, err := lock(ctx, name)
			if err != nil {
				return nil, err
			}
			// cancel gives the keys back and returns once they are deleted.
			return func() error { cancel(); return nil }, nil
		}
	}}
}

// BenchmarkClientScriptsLockers is BenchmarkUncontended with rueidislock beside guard,
// redislock and redsync: an uncontended take-and-release of a free name.
func BenchmarkClientScriptsLockers(b *testing.B) {
	srv := testserver.StartRedis(b)
	all := append(slices.Clone(libs), rueidislockLib("rueidislock", 1), rueidislockLib("rueidislock-3keys", 2))
	for _, l := range all {
		b.Run(l.name, func(b *testing.B) {
			client, _ := newClient(b, srv.Addr)
			lock := l.open(b, client)
			ctx := context.Background()
			name := "bench:lockers:" + l.name
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			for range b.N {
				unlock, err := lock(ctx, name, false)
				if err != nil {
					b.Fatal(err)
				}
				if err := unlock(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
