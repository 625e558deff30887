package bench

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard/internal/testserver"
)

// BenchmarkUncontendedCost breaks the uncontended take-and-release of each library down by
// where its time goes, each on a redis-server of its own: client-cpu-µs/op is the CPU the
// benchmark's process used (the library, go-redis and the syscalls of both), server-cpu-µs/op
// the CPU of the redis-server (INFO cpu: networking, parsing and the commands), and
// eval-µs/op the time the server spent running scripts, with the commands they call (INFO
// commandstats of EVALSHA and EVAL; redsync takes a lock with SET NX, which is not counted).
// On a machine with few cores the client's and the server's CPU add up to most of the time
// per operation.
func BenchmarkUncontendedCost(b *testing.B) {
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			srv := testserver.StartRedis(b)
			client, cnt := newClient(b, srv.Addr)
			lock := l.open(b, client)
			ctx := context.Background()
			name := "bench:cost:" + l.name
			for range 100 { // connections dialled, scripts loaded
				unlock, err := lock(ctx, name, false)
				if err != nil {
					b.Fatal(err)
				}
				if err := unlock(); err != nil {
					b.Fatal(err)
				}
			}
			admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
			b.Cleanup(func() { _ = admin.Close() })
			if err := admin.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			server0 := serverCPU(b, admin)
			before := cnt.Load()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for range b.N {
				unlock, err := lock(ctx, name, false)
				if err != nil {
					b.Fatal(err)
				}
				if err := unlock(); err != nil {
					b.Fatal(err)
				}
			}
			cpu := cpuTime() - cpu0
			b.StopTimer()
			perOp := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
			b.ReportMetric(float64(cnt.Load()-before)/float64(b.N), "roundtrips/op")
			b.ReportMetric(perOp(cpu), "client-cpu-µs/op")
			b.ReportMetric(perOp(serverCPU(b, admin)-server0), "server-cpu-µs/op")
			b.ReportMetric(perOp(evalTime(b, admin)), "eval-µs/op")
		})
	}
}

// serverCPU returns the user and system CPU time the server has used (INFO cpu).
func serverCPU(tb testing.TB, c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total time.Duration
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_user" && k != "used_cpu_sys") {
			continue
		}
		s, err := strconv.ParseFloat(v, 64)
		if err != nil {
			tb.Fatal(err)
		}
		total += time.Duration(s * float64(time.Second))
	}
	return total
}

// evalTime returns the time the server spent in EVALSHA and EVAL (INFO commandstats).
func evalTime(tb testing.TB, c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total time.Duration
	for line := range strings.Lines(info) {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		switch strings.TrimPrefix(name, "cmdstat_") {
		case "evalsha", "eval":
		default:
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					tb.Fatal(err)
				}
				total += time.Duration(us) * time.Microsecond
			}
		}
	}
	return total
}
