package bench

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/redisstore"
)

// BenchmarkHandoffParts breaks guard's hand-over down (issue 21, P2): a holder releases ONE
// name while a waiter is queued for it, and each op measures, from the moment the holder
// calls Release,
//
//   - release: until its Release returns — the release's round trip, which on the server
//     also hands the name to the waiter and publishes the notice;
//   - handover: until the waiter's Acquire returns — what the next holder's caller sees;
//   - and, beside them, a PING's round trip on the same server at the same moments: the
//     network's floor.
//
// It reports the median, p90 and p99 of each, the commands both sides sent per op, and the
// server's own time per script (INFO commandstats).
// "one-guard" runs holder and waiter on one Guard (the waiter is woken inside the Guard);
// "two-guards" on two, each with its own client (the waiter hears the notice over pub/sub).
func BenchmarkHandoffParts(b *testing.B) {
	srv := testserver.StartRedis(b)
	for _, tc := range []struct {
		name   string
		guards int
	}{{"one-guard", 1}, {"two-guards", 2}} {
		b.Run(tc.name, func(b *testing.B) {
			var gs []*guard.Guard
			var counters []*testserver.RoundTrips
			for range tc.guards {
				client, cnt := newClient(b, srv.Addr)
				g := guard.New(redisstore.New(client))
				b.Cleanup(func() { _ = g.Close(context.Background()) })
				gs = append(gs, g)
				counters = append(counters, cnt)
			}
			holderG, waiterG := gs[0], gs[len(gs)-1]
			pinger, _ := newClient(b, srv.Addr)
			sent := func() (n int64) {
				for _, c := range counters {
					n += c.Load()
				}
				return n
			}
			calls0, usec0 := scriptStats(b, srv.Addr)
			waitCalls, waitUsec := measure(b, srv.Addr, "bench:handoff-parts:"+tc.name, holderG, waiterG, pinger, sent)
			calls, usec := scriptStats(b, srv.Addr)
			calls, usec = calls-waitCalls, usec-waitUsec // the benchmark's own Inspects left out
			if calls > calls0 {
				b.ReportMetric(float64(usec-usec0)/float64(calls-calls0), "srv-µs/script")
			}
		})
	}
}

// scriptStats returns how many scripts (EVALSHA) the server at addr has run and the
// microseconds it spent in them.
func scriptStats(tb testing.TB, addr string) (calls, usec int64) {
	info, err := testserver.RedisInfo(context.Background(), addr, "commandstats")
	if err != nil {
		tb.Fatal(err)
	}
	for field := range strings.SplitSeq(info["cmdstat_evalsha"], ",") {
		k, v, _ := strings.Cut(field, "=")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "calls":
			calls = n
		case "usec":
			usec = n
		}
	}
	return calls, usec
}

// measure runs the hand-overs and reports their parts. It returns the scripts its own waits
// for the waiter ran on the server, and their time, for the caller to leave out.
func measure(b *testing.B, addr, name string, holderG, waiterG *guard.Guard, pinger *redis.Client, sent func() int64) (waitCalls, waitUsec int64) {
	ctx := context.Background()
	inspector := redisstore.New(pinger)
	release := make([]time.Duration, 0, b.N)
	handover := make([]time.Duration, 0, b.N)
	ping := make([]time.Duration, 0, b.N)
	held, err := holderG.Acquire(ctx, name)
	if err != nil {
		b.Fatal(err)
	}
	before := sent()
	b.ResetTimer()
	for range b.N {
		got := make(chan *guard.Lock, 1)
		go func() {
			l, err := waiterG.Acquire(ctx, name, guard.WaitTime(10*time.Second))
			if err != nil {
				b.Error(err)
			}
			got <- l
		}()
		// Wait until the waiter is queued on the server (asked through the PING client, so
		// that the Guards' command counts leave it out).
		c0, u0 := scriptStats(b, addr)
		for {
			info, err := inspector.Inspect(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			if info.Waiting > 0 {
				break
			}
		}
		c1, u1 := scriptStats(b, addr)
		waitCalls, waitUsec = waitCalls+c1-c0, waitUsec+u1-u0
		t0 := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		next := <-got
		t2 := time.Now()
		if next == nil {
			b.FailNow()
		}
		release = append(release, t1.Sub(t0))
		handover = append(handover, t2.Sub(t0))
		p0 := time.Now()
		if err := pinger.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		ping = append(ping, time.Since(p0))
		held = next // the waiter holds it now and releases it in the next op
	}
	b.StopTimer()
	_ = held.Release(ctx)
	b.ReportMetric(float64(sent()-before)/float64(b.N), "cmds/op")
	for _, m := range []struct {
		unit string
		ds   []time.Duration
	}{{"release", release}, {"handover", handover}, {"ping", ping}} {
		slices.Sort(m.ds)
		at := func(q float64) float64 {
			return float64(m.ds[min(int(q*float64(len(m.ds))), len(m.ds)-1)].Nanoseconds()) / 1e3
		}
		b.ReportMetric(at(0.5), m.unit+"-p50-µs")
		b.ReportMetric(at(0.9), m.unit+"-p90-µs")
		b.ReportMetric(at(0.99), m.unit+"-p99-µs")
	}
	return waitCalls, waitUsec
}
