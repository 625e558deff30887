package grpcguard_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/grpcguard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/tracing"
)

// certificate makes a certificate for template signed by parent (itself when parent is nil).
func certificate(t *testing.T, tmpl *x509.Certificate, parent *tls.Certificate) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// TestPeerFromClientCertificate: by default "{peer}" is the verified client certificate's
// first URI SAN, else its common name.
func TestPeerFromClientCertificate(t *testing.T) {
	b := loadBank(t)
	ca := certificate(t, &x509.Certificate{Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Leaf)
	server := certificate(t, &x509.Certificate{Subject: pkix.Name{CommonName: "server"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, &ca)
	spiffe, _ := url.Parse("spiffe://example.org/billing")
	withURI := certificate(t, &x509.Certificate{Subject: pkix.Name{CommonName: "billing"}, URIs: []*url.URL{spiffe},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &ca)
	withCN := certificate(t, &x509.Certificate{Subject: pkix.Name{CommonName: "reports"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &ca)

	g := newGuard(t)
	ic, err := grpcguard.New(g, grpcguard.Files(b.files), grpcguard.Method(withdraw, "caller:{peer}"))
	require.NoError(t, err)
	var seen atomic.Value
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{server}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven,
	})))
	b.register(s, &handlers{withdraw: func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
		l, _ := guard.FromContext(ctx)
		seen.Store(l.Name())
		return b.fenceReply(t, ctx), nil
	}})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)

	for _, c := range []struct {
		cert []tls.Certificate
		want string
		code codes.Code
	}{
		{[]tls.Certificate{withURI}, "caller:spiffe%3A%2F%2Fexample.org%2Fbilling", codes.OK},
		{[]tls.Certificate{withCN}, "caller:reports", codes.OK},
		{nil, "", codes.Unauthenticated},
	} {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: pool, Certificates: c.cert,
		})))
		require.NoError(t, err)
		seen.Store("")
		_, err = call(t, conn, b, withdraw, `{}`)
		assert.Equal(t, c.code, status.Code(err), "%v", err)
		assert.Equal(t, c.want, seen.Load())
		_ = conn.Close()
	}
}

// TestSpansNestInTheServerSpan: under otelgrpc's stats handler, guard's spans are children
// of the call's server span.
func TestSpansNestInTheServerSpan(t *testing.T) {
	b := loadBank(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	g := guard.New(memstore.New(), guard.WithObserver(tracing.New(tracing.WithTracerProvider(tp))))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	ic, err := grpcguard.New(g, grpcguard.Files(b.files), grpcguard.Method(withdraw, "account:{account_id}"))
	require.NoError(t, err)
	conn := serve(t, b, &handlers{}, grpc.UnaryInterceptor(ic.Unary()),
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp))))
	_, err = call(t, conn, b, withdraw, `{"account_id":"a"}`)
	require.NoError(t, err)
	require.NoError(t, tp.ForceFlush(context.Background()))
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	server := byName["bank.v1.Accounts/Withdraw"]
	require.NotNil(t, server, "otelgrpc's server span")
	for _, name := range []string{"guard.acquire account:{account_id}", "guard.hold account:{account_id}"} {
		s := byName[name]
		require.NotNil(t, s, name)
		assert.Equal(t, server.SpanContext().SpanID(), s.Parent().SpanID(), "%s is a child of the server span", name)
	}
}

// TestRetryBusy: the client interceptor waits out a busy lock by the RetryInfo delay.
func TestRetryBusy(t *testing.T) {
	b := loadBank(t)
	g := newGuard(t)
	ic, err := grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(withdraw, "account:{account_id}", guard.LeaseTime(300*time.Millisecond)))
	require.NoError(t, err)
	entered := make(chan struct{}, 4)
	conn := serve(t, b, &handlers{withdraw: func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
		entered <- struct{}{}
		_ = hold(ctx, req)
		return b.fenceReply(t, ctx), nil
	}}, grpc.UnaryInterceptor(ic.Unary()))
	retrying, err := grpc.NewClient(conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(grpcguard.RetryBusy(5, time.Second)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = retrying.Close() })

	held := make(chan error, 1)
	go func() {
		_, err := call(t, conn, b, withdraw, `{"account_id":"a","hold_ms":"250"}`)
		held <- err
	}()
	<-entered
	_, err = call(t, conn, b, withdraw, `{"account_id":"a"}`)
	assert.Equal(t, codes.Aborted, status.Code(err), "without the interceptor")
	_, err = call(t, retrying, b, withdraw, `{"account_id":"a"}`)
	assert.NoError(t, err, "with it")
	require.NoError(t, <-held)
}
