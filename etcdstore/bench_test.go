package etcdstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
)

// BenchmarkRenew measures what the watchdog's batch costs: one Extend of 10,000 held locks of
// one TTL — the requests it sends and the time it takes. They share one etcd lease, so the
// batch is one look at that lease's keys, however many locks there are.
func BenchmarkRenew(b *testing.B) {
	for _, n := range []int{100, 10_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			one := testserver.StartEtcd(b)
			s, rt := newCounted(b, one.Endpoints())
			leases := make([]guard.Lease, n)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 64)
			for i := range leases {
				leases[i] = guard.Lease{Name: fmt.Sprintf("renew/%05d", i), Token: token(), TTL: 30 * time.Second}
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					if _, err := s.Acquire(context.Background(), guard.Request{Name: leases[i].Name, Token: leases[i].Token, TTL: leases[i].TTL}); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			before := rt.Load()
			b.ResetTimer()
			for range b.N {
				for i, err := range s.Extend(context.Background(), leases) {
					if err != nil {
						b.Fatalf("lease %d: %v", i, err)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(rt.Load()-before)/float64(b.N), "requests/op")
		})
	}
}
