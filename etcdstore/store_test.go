package etcdstore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
)

// expiryOf returns when the Store's janitor ends token's key of name.
func expiryOf(t *testing.T, s *Store, name, token string) time.Time {
	t.Helper()
	s.janitor.mu.Lock()
	defer s.janitor.mu.Unlock()
	o := s.janitor.keys[ownKey{name, token}]
	require.NotNil(t, o, "the Store does not know its key")
	return o.expires
}

// TestExtendAnswersOutOfOrder renews a lock twice, the second renewal sent while the first is
// out (as the watchdog's hedge is), and lets the first one's answer come last: the key must
// still live until the second renewal's end. Were the first answer to set it back, the janitor
// would delete the key while the Guard trusts the second renewal.
func TestExtendAnswersOutOfOrder(t *testing.T) {
	const ttl = 3 * time.Second
	one := testserver.StartEtcd(t)
	entered, letGo := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	hold := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == "/etcdserverpb.Lease/LeaseTimeToLive" && held.CompareAndSwap(false, true) {
			close(entered)
			<-letGo // answered by the server, not yet by the client
		}
		return err
	})
	s := New(newClient(t, one.Endpoints(), []grpc.DialOption{hold}))
	t.Cleanup(func() { _ = s.Close() })
	r := guard.Request{Name: t.Name(), Token: token(), TTL: ttl}
	_, err := s.Acquire(t.Context(), r)
	require.NoError(t, err)
	lease := []guard.Lease{{Name: r.Name, Token: r.Token, TTL: ttl}}

	late := make(chan []error, 1)
	go func() { late <- s.Extend(context.Background(), lease) }()
	<-entered
	hedge := time.Now()
	require.NoError(t, s.Extend(t.Context(), lease)[0])
	close(letGo)
	require.NoError(t, (<-late)[0])
	assert.False(t, expiryOf(t, s, r.Name, r.Token).Before(hedge.Add(ttl)),
		"a renewal answered late set the key's end back before the later renewal's")
	require.NoError(t, s.Release(t.Context(), r.Name, r.Token, 0))
}

// lateCopies is two Guards on one etcd member, a and b, each on a Store of its own; b's client
// holds the next transaction it sends once armed — it lands after delay, whatever became of
// its caller, as a copy held up in a paused leader does — and answers the caller only when
// the caller's try gives up. landed has the late copy's own answer.
type lateCopies struct {
	a, b   *guard.Guard
	sa     *Store
	armed  atomic.Bool
	landed chan error
}

func newLateCopies(t *testing.T, delay time.Duration) *lateCopies {
	one := testserver.StartEtcd(t)
	lc := &lateCopies{landed: make(chan error, 1)}
	late := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != "/etcdserverpb.KV/Txn" || !lc.armed.CompareAndSwap(true, false) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		go func() {
			time.Sleep(delay)
			lc.landed <- invoker(context.Background(), method, req, reply, cc, opts...)
		}()
		<-ctx.Done()
		return ctx.Err()
	})
	lc.sa = New(newClient(t, one.Endpoints(), nil))
	lc.a = guard.New(lc.sa)
	sb := New(newClient(t, one.Endpoints(), []grpc.DialOption{late}))
	lc.b = guard.New(sb)
	t.Cleanup(func() {
		_ = lc.a.Close(context.Background())
		_ = lc.b.Close(context.Background())
		_ = lc.sa.Close()
		_ = sb.Close()
	})
	return lc
}

// TestLateWaiterKeyIsSwept: a waiter's acquire is held up on its way (a paused leader) until
// its caller gave up and the Guard's owner-checked releases of its token were answered "not
// held"; then it lands, and puts a waiter's key on the session's waiter lease — which the
// session keeps alive for the Store's other keys — that no Guard knows. Once the holder
// releases, that key heads the queue and nobody claims or releases it: the name was blocked for
// as long as the process lived (a reviewer's 3-member cluster, leader stopped 8–10 s: ≥ 96 s).
// The janitor must sweep it away, and the next waiter must get the name.
func TestLateWaiterKeyIsSwept(t *testing.T) {
	lc := newLateCopies(t, time.Second) // lands long after its caller gave up
	a, b, armed, landed := lc.a, lc.b, &lc.armed, lc.landed
	name := t.Name()
	held, err := a.Acquire(t.Context(), name)
	require.NoError(t, err)
	// b keeps a key on its waiter lease meanwhile, so that its session keeps that lease alive,
	// as a busy process's would.
	other, err := b.Acquire(t.Context(), name+"-other")
	require.NoError(t, err)
	waiting := make(chan error, 1)
	go func() {
		l, err := b.Acquire(t.Context(), name+"-other", guard.WaitTime(time.Minute))
		if err == nil {
			err = l.Release(context.Background())
		}
		waiting <- err
	}()

	armed.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err = b.Acquire(ctx, name, guard.WaitTime(time.Minute))
	cancel()
	require.Error(t, err, "the acquire whose request is held up")
	require.NoError(t, <-landed, "the late request")

	require.NoError(t, held.Release(t.Context()))
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	next, err := a.Acquire(ctx, name, guard.WaitTime(10*time.Second))
	require.NoError(t, err, "the name stayed blocked by a waiter key nobody knows")
	t.Logf("the next waiter got the name %v after the release", time.Since(start).Round(time.Millisecond))
	require.NoError(t, next.Release(t.Context()))
	require.NoError(t, other.Release(t.Context()))
	require.NoError(t, <-waiting)
}

// TestLateCopyAfterARetryIsSwept: a waiter's acquire goes out, is held up (a paused leader),
// and its try times out; the retry succeeds, the waiter is granted the name and releases it.
// Then the first copy lands: on a free name, it takes it on the Store's hold lease for a token
// nobody holds any more. The retry's success must not keep the janitor from sweeping it (a
// reviewer's 3-member cluster: the name blocked for the rest of the run in 1 of 4 pauses).
func TestLateCopyAfterARetryIsSwept(t *testing.T) {
	lc := newLateCopies(t, 4*time.Second) // lands after the retry's whole life
	a, b, sa, armed, landed := lc.a, lc.b, lc.sa, &lc.armed, lc.landed
	name := t.Name()
	// b keeps a lock meanwhile, so that its session keeps its hold lease alive.
	other, err := b.Acquire(t.Context(), name+"-other")
	require.NoError(t, err)
	held, err := a.Acquire(t.Context(), name)
	require.NoError(t, err)

	armed.Store(true)
	granted := make(chan *guard.Lock, 1)
	go func() {
		l, err := b.Acquire(t.Context(), name, guard.WaitTime(time.Minute))
		assert.NoError(t, err, "the waiter whose first try was held up")
		granted <- l
	}()
	require.Eventually(t, func() bool { return !armed.Load() }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { // the try timed out, and the retry queued
		info, err := sa.Inspect(t.Context(), name)
		return err == nil && info.Waiting == 1
	}, 10*time.Second, 10*time.Millisecond, "the retry never queued")
	require.NoError(t, held.Release(t.Context()))
	l := <-granted
	require.NotNil(t, l)
	require.NoError(t, l.Release(t.Context()))
	require.NoError(t, <-landed, "the late copy")

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	next, err := a.Acquire(ctx, name, guard.WaitTime(10*time.Second))
	require.NoError(t, err, "the name stayed taken by a late copy's key nobody knows")
	t.Logf("the name was free again %v after the late copy landed", time.Since(start).Round(time.Millisecond))
	require.NoError(t, next.Release(t.Context()))
	require.NoError(t, other.Release(t.Context()))
}

// TestAcquireAfterLeaseRevoked: a leader that resumes after a pause revokes the leases that ran
// out meanwhile, while the Store still believes in them; an acquire that puts its key on such a
// lease is refused whole ("requested lease not found"). The Store must find out and try again
// on a lease granted anew — a reviewer saw 13–16 acquires fail so at a resume, each with 50 s of
// its wait left.
func TestAcquireAfterLeaseRevoked(t *testing.T) {
	one := testserver.StartEtcd(t)
	client := newClient(t, one.Endpoints(), nil)
	s := New(client)
	g := guard.New(s)
	t.Cleanup(func() {
		_ = g.Close(context.Background())
		_ = s.Close()
	})
	first, err := g.Acquire(t.Context(), t.Name()+"-a", guard.WaitTime(time.Second))
	require.NoError(t, err)
	require.NoError(t, first.Release(t.Context()))
	ids := s.session.leaseIDs()
	require.NotEmpty(t, ids)
	for _, id := range ids {
		_, err := client.Revoke(t.Context(), id)
		require.NoError(t, err)
	}
	l, err := g.Acquire(t.Context(), t.Name()+"-b", guard.WaitTime(time.Second))
	require.NoError(t, err, "an acquire on a lease the server revoked")
	require.NoError(t, l.Release(t.Context()))
}
