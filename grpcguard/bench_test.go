package grpcguard_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/guardlock/guard/grpcguard"
)

// BenchmarkInterceptor measures what the unary interceptor adds to a call, on the in-process
// backend: a bare handler, a method without a rule, and a locked method (name from a field,
// acquire, run, release).
func BenchmarkInterceptor(b *testing.B) {
	bk := loadBank(b)
	g := newGuardB(b)
	ic, err := grpcguard.New(g, grpcguard.Files(bk.files), grpcguard.Method(withdraw, "account:{account_id}"))
	require.NoError(b, err)
	unary := ic.Unary()
	req := bk.message(b, "WithdrawRequest", `{"account_id":"a-1"}`)
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	ctx := context.Background()
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = handler(ctx, req)
		}
	})
	for _, c := range []struct{ name, method string }{{"unlocked", deposit}, {"locked", withdraw}} {
		info := &grpc.UnaryServerInfo{FullMethod: c.method}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := unary(ctx, req, info, handler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
