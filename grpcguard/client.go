package grpcguard

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// minRetryDelay is the shortest wait of RetryBusy between two calls.
const minRetryDelay = 10 * time.Millisecond

// RetryBusy returns a unary client interceptor that calls again, up to attempts calls in
// all, when the server answers Aborted or ResourceExhausted with a RetryInfo detail — a busy
// lock or exhausted permits, as this package's server interceptors answer — after the delay
// the detail gives, but no longer than maxDelay and no shorter than 10 ms. A call without
// RetryInfo, with another code, or whose context ends first returns as it is. gRPC's own retry
// policy cannot read a delay from the answer; this can.
//
// The delay is the holder's remaining lease: for a lock renewed by the watchdog, its whole
// TTL (30 s by default), although the holder may finish much sooner. maxDelay is then the
// delay: set it to about the time a call under the lock takes.
func RetryBusy(attempts int, maxDelay time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		for n := 1; ; n++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil || n >= attempts {
				return err
			}
			d, ok := retryDelay(err)
			if !ok {
				return err
			}
			t := time.NewTimer(max(min(d, maxDelay), minRetryDelay))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return err
			}
		}
	}
}

// retryDelay returns the RetryInfo delay of a busy answer.
func retryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || (st.Code() != codes.Aborted && st.Code() != codes.ResourceExhausted) {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}
