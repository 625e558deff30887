package etcdstore

import (
	"context"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
)

// deployments are the etcd deployments the Store is tested on.
var deployments = []struct {
	name  string
	start func(tb testing.TB) *testserver.EtcdCluster
}{
	{"Single", testserver.StartEtcd},
	{"Cluster", func(tb testing.TB) *testserver.EtcdCluster { return testserver.StartEtcdCluster(tb, 3) }},
}

// TestConformance runs the backend conformance suite on one member and on a cluster of three,
// with a client that knows every member.
func TestConformance(t *testing.T) {
	for _, dep := range deployments {
		t.Run(dep.name, func(t *testing.T) {
			locktest.Run(t, harness(t, dep.start(t)))
		})
	}
}

// BenchmarkConformance runs the backend benchmarks of the suite on one member and on a
// cluster of three.
func BenchmarkConformance(b *testing.B) {
	for _, dep := range deployments {
		b.Run(dep.name, func(b *testing.B) {
			locktest.Bench(b, harness(b, dep.start(b)))
		})
	}
}

// harness returns the conformance harness for the cluster c. Every backend it makes has a
// client of its own; the suite's Delete, Overwrite and Wipe go behind their backs through an
// admin client.
func harness(tb testing.TB, c *testserver.EtcdCluster) locktest.Harness {
	adm := newClient(tb, c.Endpoints(), nil)
	keys := New(adm)
	head := func(tb testing.TB, name string) *clientv3.GetResponse {
		start, end := keys.nameRange(name)
		resp, err := adm.Get(context.Background(), start, clientv3.WithRange(end), clientv3.WithLimit(1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		require.NoError(tb, err)
		require.NotEmpty(tb, resp.Kvs, "no lock %q", name)
		return resp
	}
	return locktest.Harness{
		New: func(tb testing.TB) locktest.Target {
			s, rt := newCounted(tb, c.Endpoints())
			return locktest.Target{Backend: s, RoundTrips: rt.Load}
		},
		Delete: func(tb testing.TB, name string) {
			kv := head(tb, name).Kvs[0]
			_, err := adm.Delete(context.Background(), string(kv.Key))
			require.NoError(tb, err)
		},
		Overwrite: func(tb testing.TB, name string) {
			// The holder's key gives way to an intruder's, on the holder's lease.
			kv := head(tb, name).Kvs[0]
			resp, err := adm.Txn(context.Background()).
				If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
				Then(clientv3.OpDelete(string(kv.Key)),
					clientv3.OpPut(keys.key(name, "intruder"), string(kv.Value), clientv3.WithLease(clientv3.LeaseID(kv.Lease)))).
				Commit()
			require.NoError(tb, err)
			require.True(tb, resp.Succeeded, "the lock %q changed while it was overwritten", name)
		},
		Wipe: func(tb testing.TB) {
			_, err := adm.Delete(context.Background(), DefaultPrefix, clientv3.WithPrefix())
			require.NoError(tb, err)
		},
		Killable: func(tb testing.TB) (locktest.Target, func()) {
			one := testserver.StartEtcd(tb)
			s, rt := newCounted(tb, one.Endpoints())
			return locktest.Target{Backend: s, RoundTrips: rt.Load}, one.Members[0].Kill
		},
	}
}

// newClient returns a client of the members at endpoints, closed when the test ends, with
// timings that notice a dead member within a second or two; opts add gRPC dial options.
func newClient(tb testing.TB, endpoints []string, opts []grpc.DialOption) *clientv3.Client {
	tb.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 2 * time.Second,
		DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second,
		DialOptions: opts, Logger: zap.NewNop(),
	})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// newCounted returns a Store on a client of its own whose lock requests are counted, closed
// when the test ends.
func newCounted(tb testing.TB, endpoints []string) (*Store, *roundTrips) {
	rt := &roundTrips{}
	s := New(newClient(tb, endpoints, rt.dialOptions()))
	tb.Cleanup(func() { _ = s.Close() })
	return s, rt
}

// roundTrips counts the requests a Store sends for lock operations: every unary call and
// every stream it opens, but those it marks as its session's own (granting and keeping its
// leases alive in the background) and watches, which serve waiting, not an operation.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) Load() int64 { return r.n.Load() }

func (r *roundTrips) count(ctx context.Context, method string) {
	if !isBookkeeping(ctx) && !strings.HasPrefix(method, "/etcdserverpb.Watch/") {
		r.n.Add(1)
	}
}

func (r *roundTrips) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			r.count(ctx, method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
			method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			r.count(ctx, method)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// token returns a new owner token.
func token() string { return rand.Text() }
