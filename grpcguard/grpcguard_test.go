package grpcguard_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/grpcguard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/redisstore"
)

const (
	withdraw = "/bank.v1.Accounts/Withdraw"
	deposit  = "/bank.v1.Accounts/Deposit"
	audit    = "/bank.v1.Accounts/Audit"
	imports  = "/bank.v1.Accounts/Import"
)

func newGuard(t *testing.T) *guard.Guard { return newGuardB(t) }

func newGuardB(tb testing.TB) *guard.Guard {
	g := guard.New(memstore.New())
	tb.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}

// TestRulesCheckedAtConstruction: every mistake in a rule is refused by New, naming the
// method, the template and what is wrong — never found by the first call.
func TestRulesCheckedAtConstruction(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	cases := []struct {
		method, template string
		opts             []guard.LockOption
		reason           string
	}{
		{"bank.v1.Accounts/Withdraw", "account:{account_id}", nil, "not a full method name"},
		{"/bank.v1.Nope/Withdraw", "account:{account_id}", nil, "no service bank.v1.Nope"},
		{"/bank.v1.Accounts/Steal", "account:{account_id}", nil, "has no method Steal"},
		{withdraw, "account:{acount_id}", nil, `bank.v1.WithdrawRequest has no field "acount_id"`},
		{withdraw, "account:{accountId}", nil, `its proto name is "account_id"`},
		{withdraw, "account:{customer.name}", nil, `bank.v1.Customer has no field "name"`},
		{withdraw, "account:{customer}", nil, "is a message (bank.v1.Customer): name one of its fields"},
		{withdraw, "account:{tags}", nil, "repeated"},
		{withdraw, "account:{labels}", nil, "repeated"},
		{withdraw, "account:{rate}", nil, "a double field names no resource exactly"},
		{withdraw, "account:{amount.x}", nil, "amount is not a message"},
		{withdraw, "account:{account_id", nil, "(at byte"},
		{withdraw, "account:{md.X-Tenant}", nil, "lower case"},
		{withdraw, "account:{md.grpc-timeout}", nil, "gRPC keeps md.grpc-timeout to itself"},
		{withdraw, "account:{md.te}", nil, "gRPC keeps md.te to itself"},
		{withdraw, "account:{account_id}", []guard.LockOption{grpcguard.Permits(0)}, "Permits(0)"},
		{withdraw, "account:{account_id}", []guard.LockOption{guard.WaitTime(-2 * time.Second)}, "WaitTime"},
		{audit, "audit:{account_id}", nil, "a stream's messages are not known when it opens"},
		{imports, "import:{line}", nil, "a stream's messages are not known when it opens"},
	}
	for _, c := range cases {
		t.Run(c.template, func(t *testing.T) {
			_, err := grpcguard.New(g, grpcguard.Files(b.files), grpcguard.Method(c.method, c.template, c.opts...))
			re, ok := errors.AsType[*grpcguard.RuleError](err)
			require.True(t, ok, "want a *RuleError, got %v", err)
			assert.Equal(t, c.method, re.Method)
			assert.Contains(t, err.Error(), c.reason)
		})
	}
	_, err := grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(withdraw, "a:{account_id}"), grpcguard.Method(withdraw, "b:{account_id}"))
	assert.ErrorContains(t, err, "a second rule")
	// Without Files, the methods are looked up where generated code registers them.
	_, err = grpcguard.New(g, grpcguard.Method(withdraw, "account:{account_id}"))
	assert.ErrorContains(t, err, "no service bank.v1.Accounts among the registered descriptors")

	_, err = grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(withdraw, "account:{account_id}:{customer.referrer.id}:{tenant}:{region}:{currency}:{branch}:{key}:{sequence}:{urgent}:{md.x-tenant}:{peer}"),
		grpcguard.Method(audit, "audit:{md.x-tenant}"))
	assert.NoError(t, err)
}

// call makes one Withdraw (or another unary method) call with a request given as JSON.
func call(t *testing.T, conn *grpc.ClientConn, b bank, method, json string, md ...string) (*dynamicpb.Message, error) {
	ctx := t.Context()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	out := b.message(t, "WithdrawReply", "")
	err := conn.Invoke(ctx, method, b.message(t, "WithdrawRequest", json), out)
	return out, err
}

func fenceOf(m *dynamicpb.Message) uint64 {
	return m.Get(m.Descriptor().Fields().ByName("fence")).Uint()
}

// TestNamesFromMessages: the name comes from the request's fields, nested ones, wrappers,
// enums and metadata; a value missing or empty is InvalidArgument, and the handler never
// runs.
func TestNamesFromMessages(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	var names []string
	var mu sync.Mutex
	ic, err := grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(withdraw, "account:{account_id}/{customer.id}/{tenant}/{currency}/{md.x-tenant}"),
		grpcguard.Method(deposit, "branch:{branch}/{region}/{key}"))
	require.NoError(t, err)
	conn := serve(t, b, &handlers{withdraw: func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
		l, ok := guard.FromContext(ctx)
		require.True(t, ok)
		mu.Lock()
		names = append(names, l.Name())
		mu.Unlock()
		return b.fenceReply(t, ctx), nil
	}}, grpc.UnaryInterceptor(ic.Unary()))

	full := `{"account_id":"a/1","customer":{"id":"c 7"},"tenant":"t1","currency":"EUR"}`
	_, err = call(t, conn, b, withdraw, full, "x-tenant", "acme")
	require.NoError(t, err)
	_, err = call(t, conn, b, deposit, `{"branch":"0","region":"0","key":"AAE="}`)
	require.NoError(t, err, "explicit presence: zero is a value")
	assert.Equal(t, []string{"account:a%2F1/c%207/t1/1/acme", "branch:0/0/AAE"}, names, "enums by number")

	bad := []struct{ method, json, why string }{
		{withdraw, `{"customer":{"id":"c"},"tenant":"t","currency":"EUR"}`, "{account_id}: missing"},
		{withdraw, `{"account_id":"a","tenant":"t","currency":"EUR"}`, "{customer.id}: missing"},
		{withdraw, `{"account_id":"a","customer":{},"tenant":"t","currency":"EUR"}`, "{customer.id}: missing"},
		{withdraw, `{"account_id":"a","customer":{"id":"c"},"currency":"EUR"}`, "{tenant}: missing"},
		{withdraw, `{"account_id":"a","customer":{"id":"c"},"tenant":"","currency":"EUR"}`, "{tenant}: empty value"},
		{withdraw, `{"account_id":"a","customer":{"id":"c"},"tenant":"t"}`, "{currency}: missing"},
		{deposit, `{"region":"1","key":"AAE="}`, "{branch}: missing"},
	}
	for _, c := range bad {
		_, err := call(t, conn, b, c.method, c.json, "x-tenant", "acme")
		assert.Equal(t, codes.InvalidArgument, status.Code(err), c.json)
		assert.ErrorContains(t, err, c.why)
	}
	_, err = call(t, conn, b, withdraw, full)
	assert.ErrorContains(t, err, "{md.x-tenant}: missing")
	_, err = call(t, conn, b, withdraw, full, "x-tenant", "a", "x-tenant", "b")
	assert.ErrorContains(t, err, "{md.x-tenant}: 2 values, one expected")
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Len(t, names, 2, "a call without a name ran its handler")
}

// TestBusyCodes: a held lock is Aborted, exhausted permits ResourceExhausted, each with the
// holder's remaining lease in a RetryInfo detail.
func TestBusyCodes(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	ic, err := grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(withdraw, "account:{account_id}", guard.LeaseTime(5*time.Second)),
		grpcguard.Method(deposit, "account:{account_id}", grpcguard.Permits(2), guard.LeaseTime(5*time.Second)))
	require.NoError(t, err)
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	conn := serve(t, b, &handlers{withdraw: func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
		entered <- struct{}{}
		<-release
		return b.fenceReply(t, ctx), nil
	}}, grpc.UnaryInterceptor(ic.Unary()))

	for _, c := range []struct {
		method  string
		holders int
		code    codes.Code
	}{{withdraw, 1, codes.Aborted}, {deposit, 2, codes.ResourceExhausted}} {
		release = make(chan struct{})
		var wg sync.WaitGroup
		for range c.holders {
			wg.Go(func() {
				_, err := call(t, conn, b, c.method, `{"account_id":"a1"}`)
				assert.NoError(t, err)
			})
			<-entered
		}
		_, err := call(t, conn, b, c.method, `{"account_id":"a1"}`)
		st := status.Convert(err)
		assert.Equal(t, c.code, st.Code(), st.Message())
		var delay time.Duration
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				delay = ri.GetRetryDelay().AsDuration()
			}
		}
		assert.Greater(t, delay, 3*time.Second, "RetryInfo carries the holder's remaining lease")
		assert.LessOrEqual(t, delay, 5*time.Second)
		close(release)
		wg.Wait()
	}
}

// TestLockLostEndsTheCall: when the lock is lost while the handler runs, the handler's
// context ends and the call is Aborted, whatever the handler returned.
func TestLockLostEndsTheCall(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	ic, err := grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(withdraw, "account:{account_id}", guard.LeaseTime(200*time.Millisecond)))
	require.NoError(t, err)
	var cause atomic.Value
	conn := serve(t, b, &handlers{withdraw: func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
		err := hold(ctx, req)
		if err != nil {
			cause.Store(err)
		}
		return b.fenceReply(t, ctx), nil // as if it did not notice
	}}, grpc.UnaryInterceptor(ic.Unary()))
	_, err = call(t, conn, b, withdraw, `{"account_id":"a1","hold_ms":"2000"}`)
	assert.Equal(t, codes.Aborted, status.Code(err))
	assert.ErrorContains(t, err, "was lost while the call ran")
	assert.ErrorIs(t, cause.Load().(error), guard.ErrLeaseExpired)
	// A call that ends in time keeps its reply.
	out, err := call(t, conn, b, withdraw, `{"account_id":"a1","hold_ms":"10"}`)
	require.NoError(t, err)
	assert.NotZero(t, fenceOf(out))
}

// TestUnavailableBackend: a backend that cannot be reached is Unavailable, which retry
// policies act on.
func TestUnavailableBackend(t *testing.T) {
	b := loadBank(t)
	store := redisstore.New(redisClient(t, "127.0.0.1:1")) // nothing listens on port 1
	g := guard.New(store)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	ic, err := grpcguard.New(g, grpcguard.Files(b.files), grpcguard.Method(withdraw, "account:{account_id}"))
	require.NoError(t, err)
	conn := serve(t, b, &handlers{}, grpc.UnaryInterceptor(ic.Unary()))
	_, err = call(t, conn, b, withdraw, `{"account_id":"a1"}`)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
}

// TestPeerIdentity: "{peer}" without an authenticated identity is Unauthenticated; with
// Identity, the name is the identity the function reads.
func TestPeerIdentity(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	ic, err := grpcguard.New(g, grpcguard.Files(b.files), grpcguard.Method(withdraw, "user:{peer}"))
	require.NoError(t, err)
	conn := serve(t, b, &handlers{}, grpc.UnaryInterceptor(ic.Unary()))
	_, err = call(t, conn, b, withdraw, `{}`)
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)

	var seen atomic.Value
	ic, err = grpcguard.New(g, grpcguard.Files(b.files), grpcguard.Method(withdraw, "user:{peer}"),
		grpcguard.Identity(func(ctx context.Context) (string, error) {
			if v := metadata.ValueFromIncomingContext(ctx, "x-user"); len(v) == 1 {
				return v[0], nil
			}
			return "", errors.New("no user")
		}))
	require.NoError(t, err)
	conn = serve(t, b, &handlers{withdraw: func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
		l, _ := guard.FromContext(ctx)
		seen.Store(l.Name())
		return b.fenceReply(t, ctx), nil
	}}, grpc.UnaryInterceptor(ic.Unary()))
	_, err = call(t, conn, b, withdraw, `{}`, "x-user", "ann")
	require.NoError(t, err)
	assert.Equal(t, "user:ann", seen.Load())
	_, err = call(t, conn, b, withdraw, `{}`)
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
}

// TestStreamHoldsItsLock: a stream's lock, named from its metadata, is held for the stream's
// life: a second stream on the name is refused until the first ends.
func TestStreamHoldsItsLock(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	ic, err := grpcguard.New(g, grpcguard.Files(b.files), grpcguard.Method(audit, "audit:{md.x-tenant}"))
	require.NoError(t, err)
	proceed := make(chan struct{})
	conn := serve(t, b, &handlers{audit: func(req *dynamicpb.Message, stream grpc.ServerStream) error {
		l, ok := guard.FromContext(stream.Context())
		if !ok {
			return status.Error(codes.Internal, "no lock in the stream's context")
		}
		ev := b.message(t, "AuditEvent", "")
		ev.Set(ev.Descriptor().Fields().ByName("line"), protoreflect.ValueOfString(l.Name()))
		if err := stream.SendMsg(ev); err != nil {
			return err
		}
		<-proceed
		return nil
	}}, grpc.StreamInterceptor(ic.Stream()))

	open := func(tenant string) (grpc.ClientStream, error) {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", tenant)
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, audit)
		require.NoError(t, err)
		require.NoError(t, s.SendMsg(b.message(t, "AuditRequest", `{"account_id":"a"}`)))
		require.NoError(t, s.CloseSend())
		ev := b.message(t, "AuditEvent", "")
		return s, s.RecvMsg(ev)
	}
	first, err := open("acme")
	require.NoError(t, err)
	_, err = open("acme")
	assert.Equal(t, codes.Aborted, status.Code(err), "%v", err)
	_, err = open("other")
	require.NoError(t, err, "another tenant's stream")
	close(proceed)
	require.ErrorIs(t, first.RecvMsg(b.message(t, "AuditEvent", "")), io.EOF)
	_, err = open("acme")
	require.NoError(t, err, "the lock is free once the stream ended")
}

// TestUnlockedMethodCostsNothing: a method without a rule goes straight to its handler.
func TestUnlockedMethodCostsNothing(t *testing.T) {
	b := loadBank(t)
	ic, err := grpcguard.New(newGuard(t), grpcguard.Files(b.files), grpcguard.Method(withdraw, "account:{account_id}"))
	require.NoError(t, err)
	unary := ic.Unary()
	req := b.message(t, "WithdrawRequest", `{"account_id":"a"}`)
	info := &grpc.UnaryServerInfo{FullMethod: deposit}
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() { _, _ = unary(ctx, req, info, handler) })
	assert.Zero(t, allocs)
}

// TestStreamLosesItsLock: a stream's handler blocked in RecvMsg when the lock is lost does not
// hold the call open: the call ends Aborted about when the lease does, and the handler's
// read fails then (review of issue 20, F1: the call ran on until the client's deadline).
func TestStreamLosesItsLock(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	ic, err := grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(imports, "import:{md.x-tenant}", guard.LeaseTime(300*time.Millisecond)))
	require.NoError(t, err)
	handlerDone := make(chan error, 1)
	conn := serve(t, b, &handlers{imports: func(stream grpc.ServerStream) error {
		for {
			if err := stream.RecvMsg(b.message(t, "AuditEvent", "")); err != nil {
				handlerDone <- err
				return err
			}
		}
	}}, grpc.StreamInterceptor(ic.Stream()))

	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "acme"), 20*time.Second)
	defer cancel()
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, imports)
	require.NoError(t, err)
	require.NoError(t, s.SendMsg(b.message(t, "AuditEvent", `{"line":"one"}`)))
	start := time.Now()
	err = s.RecvMsg(b.message(t, "WithdrawReply", "")) // the client sends nothing more
	assert.Equal(t, codes.Aborted, status.Code(err), "%v", err)
	assert.Less(t, time.Since(start), 10*time.Second, "the call ended with the lease, not with the client's deadline")
	select {
	case err := <-handlerDone:
		assert.Error(t, err, "the handler's read failed once the call ended")
	case <-time.After(10 * time.Second):
		t.Fatal("the handler still waits in RecvMsg")
	}
	// The name is free again.
	s2, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, imports)
	require.NoError(t, err)
	require.NoError(t, s2.CloseSend())
	assert.NotEqual(t, codes.Aborted, status.Code(s2.RecvMsg(b.message(t, "WithdrawReply", ""))))
}

// TestCheckAgainstTheServer: a rule for a method the server does not serve is reported.
func TestCheckAgainstTheServer(t *testing.T) {
	b := loadBank(t)
	ic, err := grpcguard.New(newGuard(t), grpcguard.Files(b.files), grpcguard.Method(withdraw, "account:{account_id}"))
	require.NoError(t, err)
	empty := grpc.NewServer()
	err = ic.Check(empty)
	re, ok := errors.AsType[*grpcguard.RuleError](err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, withdraw, re.Method)
	full := grpc.NewServer()
	b.register(full, &handlers{})
	assert.NoError(t, ic.Check(full))
}

// TestRetryBusyWaitsAtLeast10ms: a maxDelay under 10 ms does not make a tight loop.
func TestRetryBusyWaitsAtLeast10ms(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	ic, err := grpcguard.New(g, grpcguard.Files(b.files), grpcguard.Method(withdraw, "account:{account_id}", guard.LeaseTime(5*time.Second)))
	require.NoError(t, err)
	held, err := g.Acquire(t.Context(), "account:a")
	require.NoError(t, err)
	defer held.Release(context.Background())
	conn := serve(t, b, &handlers{}, grpc.UnaryInterceptor(ic.Unary()))
	retrying, err := grpc.NewClient(conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(grpcguard.RetryBusy(6, 0)))
	require.NoError(t, err)
	defer retrying.Close()
	start := time.Now()
	_, err = call(t, retrying, b, withdraw, `{"account_id":"a"}`)
	assert.Equal(t, codes.Aborted, status.Code(err))
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "five waits of at least 10 ms")
}
