package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/tracing"
)

// leaky is a store whose server fails, and whose errors quote the lock name the way drivers
// quote keys — bare, in Go's quotes, in single quotes — and once as a *guard.NameError, whose
// text quotes the first 64 characters of a long name. Each field set makes one operation fail.
type leaky struct {
	*memstore.Store
	acquire bool       // Acquire fails
	renew   chan error // each value fails one Extend call; buffered
	release bool       // Release fails
}

func (s *leaky) Acquire(ctx context.Context, req guard.Request) (uint64, error) {
	if s.acquire {
		return 0, errors.Join(&guard.NameError{Name: req.Name, Reason: "refused by the server"},
			fmt.Errorf("dial tcp 127.0.0.1:40001: key %s unreachable (%q)", req.Name, req.Name))
	}
	return s.Store.Acquire(ctx, req)
}

func (s *leaky) Extend(ctx context.Context, leases []guard.Lease) []error {
	select {
	case err := <-s.renew:
		errs := make([]error, len(leases))
		for i, l := range leases {
			errs[i] = err
			if !errors.Is(err, guard.ErrNotHeld) {
				errs[i] = fmt.Errorf("%w on key '%s'", err, l.Name)
			}
		}
		return errs
	default:
		return s.Store.Extend(ctx, leases)
	}
}

func (s *leaky) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if s.release {
		_ = s.Store.Release(ctx, name, token, keep)
		return fmt.Errorf("connection reset while releasing %q", name)
	}
	return s.Store.Release(ctx, name, token, keep)
}

// dump writes out everything tel exported: every span's name, attributes, status, events and
// links, and every metric's data points with their attributes.
func (tel *telemetry) dump(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	kvs := func(attrs []attribute.KeyValue) {
		for _, kv := range attrs {
			fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.Emit())
		}
	}
	for _, s := range tel.spans.Started() {
		ro, ok := s.(sdktrace.ReadOnlySpan)
		require.True(t, ok)
		fmt.Fprintf(&b, "span %q status=%s %q", ro.Name(), ro.Status().Code, ro.Status().Description)
		kvs(ro.Attributes())
		for _, e := range ro.Events() {
			fmt.Fprintf(&b, "\n  event %q", e.Name)
			kvs(e.Attributes)
		}
		for _, l := range ro.Links() {
			fmt.Fprintf(&b, "\n  link")
			kvs(l.Attributes)
		}
		kvs(ro.Resource().Attributes())
		b.WriteString("\n")
	}
	for _, sm := range tel.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			fmt.Fprintf(&b, "metric %q %q", m.Name, m.Description)
			forEachAttributes(m.Data, func(set attribute.Set) { kvs(set.ToSlice()) })
			b.WriteString("\n")
		}
	}
	return b.String()
}

// Telemetry never carries a name that WithNames hides: not in attributes, not in span status,
// events or exception messages — which the errors of guard and of the backend would fill with
// it — and not in metrics; with the backend down, with a busy lock, with a loss, with a lease
// that ran out and releases that fail.
func TestNamesNeverLeak(t *testing.T) {
	const secret = "DE44500105175407324931"
	short := "acct:" + secret
	long := "tenant:" + strings.Repeat(secret, 4) // longer than the 64 characters a NameError quotes
	for _, tt := range []struct {
		policy tracing.NamePolicy
		name   string
		ref    string // what stands for the name in messages
	}{
		{tracing.NameHashed, "Hashed", "#" + tracing.HashName(short)},
		{tracing.NameDropped, "Dropped", "#redacted"},
		{tracing.NameRaw, "Raw", `"` + short + `"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tel := newTelemetry(t)
			obs := tel.observer(tracing.WithNames(tt.policy))
			var guards []*guard.Guard
			newGuard := func(t *testing.T, b guard.Backend, obs guard.Observer, opts ...guard.Option) *guard.Guard {
				g := newGuard(t, b, obs, opts...)
				guards = append(guards, g)
				return g
			}
			ctx := t.Context()
			for _, name := range []string{short, long} {
				// The backend is down.
				down := newGuard(t, &leaky{Store: memstore.New(), acquire: true}, obs)
				_, err := down.TryAcquire(ctx, name, guard.Label("acct:{iban}"))
				require.Error(t, err)
				_, err = down.Acquire(ctx, name, guard.Label("acct:{iban}"), guard.WaitTime(20*time.Millisecond))
				require.Error(t, err)

				// Busy, and a wait that runs out.
				store := memstore.New()
				holder := newGuard(t, store, obs)
				l, err := holder.Acquire(ctx, name, guard.Label("acct:{iban}"))
				require.NoError(t, err)
				_, err = newGuard(t, store, obs).TryAcquire(ctx, name, guard.Label("acct:{iban}"))
				require.ErrorIs(t, err, guard.ErrNotAcquired)
				_, err = newGuard(t, store, obs).Acquire(ctx, name, guard.Label("acct:{iban}"), guard.WaitTime(20*time.Millisecond))
				require.ErrorIs(t, err, guard.ErrNotAcquired)
				require.NoError(t, l.Release(ctx))

				// A renewal fails, then the lock is lost; its release fails.
				s := &leaky{Store: memstore.New(), renew: make(chan error, 2), release: true}
				s.renew <- errors.New("i/o timeout")
				s.renew <- guard.ErrNotHeld
				lossy := newGuard(t, s, obs, guard.WithWatchdogTimeout(150*time.Millisecond))
				l, err = lossy.Acquire(ctx, name, guard.Label("acct:{iban}"))
				require.NoError(t, err)
				<-l.Done()
				require.ErrorIs(t, context.Cause(l.Context()), guard.ErrLockLost)
				require.Error(t, l.Release(ctx))

				// A lease runs out; the release fails.
				l, err = newGuard(t, &leaky{Store: memstore.New(), release: true}, obs).
					Acquire(ctx, name, guard.Label("acct:{iban}"), guard.LeaseTime(30*time.Millisecond))
				require.NoError(t, err)
				<-l.Done()
				require.Error(t, l.Release(ctx))
			}
			for _, g := range guards {
				require.NoError(t, g.Close(ctx)) // and waits for the observer to hear of everything
			}

			out := tel.dump(t)
			for _, want := range []string{"guard.lock.renew_failed", "guard.lock.lost", "guard.lock.lease_expired",
				"exception", "connection reset", "i/o timeout", "outcome=busy", "outcome=timeout", "outcome=error"} {
				assert.Contains(t, out, want, "the dump has what happened")
			}
			assert.Contains(t, out, tt.ref, "messages name the lock as the policy says")
			if tt.policy == tracing.NameRaw {
				assert.Contains(t, out, secret, "raw names are recorded")
				return
			}
			var leaks []string
			for line := range strings.Lines(out) {
				if strings.Contains(line, "DE445001") { // the name, or a part of it
					leaks = append(leaks, line)
				}
			}
			assert.Empty(t, leaks, "telemetry that carries the hidden name")
		})
	}
}

// The status of a failed acquisition keeps the error's text, with the name replaced.
func TestRedactedStatus(t *testing.T) {
	tel := newTelemetry(t)
	g := newGuard(t, broken{memstore.New()}, tel.observer(tracing.WithNames(tracing.NameHashed)))
	_, err := g.TryAcquire(t.Context(), "acct:7", guard.Label("acct:{id}"))
	require.Error(t, err)
	acq := tel.span(t, "guard.acquire acct:{id}")
	assert.Equal(t, codes.Error, acq.Status().Code)
	want := "guard: acquire #" + tracing.HashName("acct:7") + ": dial tcp 127.0.0.1:40001: connection refused"
	assert.Equal(t, want, acq.Status().Description)
	require.NotEmpty(t, acq.Events())
	ev := acq.Events()[0]
	assert.Equal(t, "exception", ev.Name)
	assert.Equal(t, want, requireEventAttr(t, ev, "exception.message").AsString())
	assert.Equal(t, "*guard.OpError", requireEventAttr(t, ev, "exception.type").AsString())
}
