package tracing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/guardlock/guard"
)

// ScopeName is the instrumentation scope of the tracer and the meter: this package's import
// path.
const ScopeName = "github.com/guardlock/guard/tracing"

// Version is the version of this instrumentation, reported as the scope's version.
const Version = "0.1.0"

// The attributes of the spans and metrics. Durations are in seconds.
const (
	// NameKey is the lock name, as the NamePolicy says. Spans only: metrics never carry it.
	NameKey = attribute.Key("guard.lock.name")
	// LabelKey is the acquisition's label (guard.Label: its template), when one was given.
	LabelKey = attribute.Key("guard.lock.label")
	// BackendKey is the package of the Guard's backend: "memstore", "redisstore"…
	BackendKey = attribute.Key("guard.lock.backend")
	// KindKey is what an acquisition asks for and a lock holds, as guard.Kind.String() says:
	// mutex, permit, read, write or term.
	KindKey = attribute.Key("guard.lock.kind")
	// PermitsKey is the number of permits of the Semaphore a permit belongs to; only with
	// KindKey "permit".
	PermitsKey = attribute.Key("guard.lock.permits")
	// OutcomeKey is how an acquisition ended, as guard.Outcome.String() says: acquired, busy,
	// timeout, canceled or error.
	OutcomeKey = attribute.Key("guard.lock.outcome")
	// WaitKey is how long an acquisition took, from its first attempt to its outcome.
	WaitKey = attribute.Key("guard.lock.wait_seconds")
	// MaxWaitKey is how long the caller was prepared to wait: 0 for one attempt. It is left
	// out when the caller waits as long as its context allows.
	MaxWaitKey = attribute.Key("guard.lock.max_wait_seconds")
	// AttemptsKey is the number of requests an acquisition sent to the backend.
	AttemptsKey = attribute.Key("guard.lock.attempts")
	// WakeupsKey is the number of release notifications that woke a waiting acquisition.
	WakeupsKey = attribute.Key("guard.lock.wakeups")
	// FenceKey is the fencing token of an acquisition that took the lock.
	FenceKey = attribute.Key("guard.lock.fence")
	// DeadlineKey is the lock's local validity deadline (RFC 3339) after a renewal, a failed
	// renewal or an extension.
	DeadlineKey = attribute.Key("guard.lock.deadline")
	// ReasonKey says why a lock ended while held: "lost" or "lease_expired".
	ReasonKey = attribute.Key("guard.lock.reason")
	// ErrorKey is the error of a failed renewal, or the cause of a loss.
	ErrorKey = attribute.Key("error.message")
)

// NamePolicy says what the spans record of a lock name. Metrics never record it.
type NamePolicy int

// The name policies.
const (
	// NameRaw records the name as it is.
	NameRaw NamePolicy = iota
	// NameHashed records the first 16 hex digits of the SHA-256 of the name: stable across
	// instances and runs, so the spans of one name can be found together, but not readable.
	NameHashed
	// NameDropped records no name.
	NameDropped
)

// Option configures an Observer. Pass options to New.
type Option func(*config)

type config struct {
	tp    trace.TracerProvider
	mp    metric.MeterProvider
	names NamePolicy
}

// WithTracerProvider sets the TracerProvider the spans go to. Default (and with nil): the
// global one, otel.GetTracerProvider, which also reaches a provider that the program
// installs with otel.SetTracerProvider after New.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the MeterProvider the metrics go to. Default (and with nil): the
// global one, otel.GetMeterProvider, which also reaches a provider that the program installs
// with otel.SetMeterProvider after New.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithNames sets what the spans record of lock names. Default: NameRaw. See the package
// documentation for the trade-off.
func WithNames(p NamePolicy) Option {
	return func(c *config) { c.names = p }
}

// Observer is a guard.Observer that reports to OpenTelemetry. Make one with New and pass it
// to guard.WithObserver; one Observer may serve several Guards. It is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer
	names  NamePolicy

	waitTime      metric.Float64Histogram
	holdTime      metric.Float64Histogram
	acquisitions  metric.Int64Counter
	renewFailures metric.Int64Counter
	losses        metric.Int64Counter
	held          metric.Int64UpDownCounter
	permitsUsed   metric.Int64UpDownCounter // the primitives': permits, readers, writers, terms
	readers       metric.Int64UpDownCounter
	writerWait    metric.Float64Histogram
	terms         metric.Int64Counter

	// kinds caches, per label and backend, what spans and metrics repeat on every call: span
	// names and attribute sets. nkinds counts its entries, so that a caller who passes
	// high-cardinality labels cannot grow it without bound.
	kinds  sync.Map // kindKey → *kind
	nkinds atomic.Int64
}

var _ guard.Observer = (*Observer)(nil)

// maxKinds bounds the cache of labels; past it each call builds its names afresh.
const maxKinds = 1000

// New returns an Observer. It panics with an invalid NamePolicy: a programming error.
func New(opts ...Option) *Observer {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.names < NameRaw || c.names > NameDropped {
		panic(fmt.Sprintf("guard/tracing: WithNames(%d): not a NamePolicy", int(c.names)))
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	o := &Observer{
		tracer: c.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version)),
		names:  c.names,
	}
	m := c.mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version))
	var err error
	o.waitTime, err = m.Float64Histogram("guard.lock.wait.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time from the start of a lock acquisition to its outcome."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	handle(err)
	o.holdTime, err = m.Float64Histogram("guard.lock.hold.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time a lock was held, from grant to release."),
		metric.WithExplicitBucketBoundaries(holdBuckets...))
	handle(err)
	o.acquisitions, err = m.Int64Counter("guard.lock.acquisitions",
		metric.WithUnit("{acquisition}"),
		metric.WithDescription("Lock acquisitions, by outcome."))
	handle(err)
	o.renewFailures, err = m.Int64Counter("guard.lock.renewal.failures",
		metric.WithUnit("{failure}"),
		metric.WithDescription("Watchdog renewals that failed and will be tried again."))
	handle(err)
	o.losses, err = m.Int64Counter("guard.lock.losses",
		metric.WithUnit("{loss}"),
		metric.WithDescription("Locks lost, or whose lease ran out, while held."))
	handle(err)
	o.held, err = m.Int64UpDownCounter("guard.lock.held",
		metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held right now."))
	handle(err)
	o.permitsUsed, err = m.Int64UpDownCounter("guard.lock.permits.used",
		metric.WithUnit("{permit}"),
		metric.WithDescription("Semaphore permits held right now, by the semaphore's number of permits."))
	handle(err)
	o.readers, err = m.Int64UpDownCounter("guard.lock.readers",
		metric.WithUnit("{reader}"),
		metric.WithDescription("Read locks of read-write locks held right now."))
	handle(err)
	o.writerWait, err = m.Float64Histogram("guard.lock.writer.wait.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time from the start of a write-lock acquisition to its outcome."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	handle(err)
	o.terms, err = m.Int64Counter("guard.lock.terms",
		metric.WithUnit("{term}"),
		metric.WithDescription("Election terms begun: campaigns that made their instance the leader."))
	handle(err)
	return o
}

// Bucket boundaries, in seconds. A wait is a round trip (sub-millisecond to a few
// milliseconds) when the lock is free and up to a holder's whole run when it is not; a hold
// is as long as the protected work.
var (
	waitBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	holdBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// handle reports an error creating an instrument to OpenTelemetry's error handler. The API
// returns a usable (possibly no-op) instrument with such an error.
func handle(err error) {
	if err != nil {
		otel.Handle(fmt.Errorf("guard/tracing: %w", err))
	}
}

// kindKey identifies a kind.
type kindKey struct {
	label, backend string
	lock           guard.Kind
	permits        int
}

// kind is what the spans and metrics of one label on one backend share. The option slices
// are built once and passed with ..., so that recording a span or a measurement does not
// allocate a new one each time.
type kind struct {
	acquireName, holdName, releaseName string
	lock                               guard.Kind // what the locks hold

	attrs     []attribute.KeyValue    // LabelKey (when set), BackendKey, KindKey, PermitsKey (for permits)
	spanAttrs []trace.SpanStartOption // attrs, for starting a span

	// Measurement options, as the instruments take them: attrs, plus OutcomeKey by
	// guard.Outcome (the last entry for an unknown one) or ReasonKey.
	base        []metric.AddOption
	baseRecord  []metric.RecordOption
	outcome     [outcomes + 1][]metric.AddOption
	outcomeWait [outcomes + 1][]metric.RecordOption
	lost        []metric.AddOption // ReasonKey "lost"
	expired     []metric.AddOption // ReasonKey "lease_expired"
}

// outcomes is the number of guard.Outcome values.
const outcomes = int(guard.OutcomeError) + 1

func newKind(key kindKey) *kind {
	k := &kind{acquireName: "guard.acquire", holdName: "guard.hold", releaseName: "guard.release", lock: key.lock}
	if key.label != "" {
		k.acquireName += " " + key.label
		k.holdName += " " + key.label
		k.releaseName += " " + key.label
		k.attrs = append(k.attrs, LabelKey.String(key.label))
	}
	k.attrs = append(k.attrs, BackendKey.String(key.backend), KindKey.String(key.lock.String()))
	if key.lock == guard.KindPermit {
		k.attrs = append(k.attrs, PermitsKey.Int(key.permits))
	}
	k.spanAttrs = []trace.SpanStartOption{trace.WithAttributes(k.attrs...)}
	with := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		all := append(append(make([]attribute.KeyValue, 0, len(k.attrs)+len(kv)), k.attrs...), kv...)
		return metric.WithAttributeSet(attribute.NewSet(all...))
	}
	base := with()
	k.base, k.baseRecord = []metric.AddOption{base}, []metric.RecordOption{base}
	for i := range k.outcome {
		opt := with(OutcomeKey.String(guard.Outcome(i).String())) // "unknown" for the last
		k.outcome[i], k.outcomeWait[i] = []metric.AddOption{opt}, []metric.RecordOption{opt}
	}
	k.lost = []metric.AddOption{with(ReasonKey.String(guard.EventLost.String()))}
	k.expired = []metric.AddOption{with(ReasonKey.String(guard.EventLeaseExpired.String()))}
	return k
}

// kind returns the cached kind of the acquisitions like a: of its label, on its backend, of
// its guard.Kind and permits.
func (o *Observer) kind(a *guard.Acquisition) *kind {
	key := kindKey{label: a.Label, backend: a.Backend, lock: a.Kind}
	if a.Kind == guard.KindPermit {
		key.permits = a.Permits
	}
	if v, ok := o.kinds.Load(key); ok {
		return v.(*kind)
	}
	k := newKind(key)
	if o.nkinds.Load() >= maxKinds {
		return k
	}
	v, loaded := o.kinds.LoadOrStore(key, k)
	if !loaded {
		o.nkinds.Add(1)
	}
	return v.(*kind)
}

// outcomeIndex returns the index of oc in kind.outcome.
func outcomeIndex(oc guard.Outcome) int {
	if oc < 0 || int(oc) >= outcomes {
		return outcomes
	}
	return int(oc)
}

// startKey is the context key under which AcquireStart keeps the context it was given: the
// hold span becomes a child of the caller's span, not of the acquire span, and the Lock's
// context derives from it. Its presence also marks a context that AcquireStart returned,
// whose current span is the acquire span.
type startKey struct{}

// holdKey is the context key of the *holding of a Lock; the Lock's context derives from the
// context that AcquireEnd returned.
type holdKey struct{}

// holding is what the observer keeps about one held lock.
type holding struct {
	k    *kind
	span trace.Span // the hold span
	// recorded tells whether the hold span records: it stops recording when it ends, at a
	// loss, and the release that may follow still gets its span.
	recorded bool
	// counted is true while the lock counts in guard.lock.held (and permits.used or readers);
	// the first of loss, lease end and release takes it down.
	counted atomic.Bool
}

// AcquireStart starts the acquire span as a child of the caller's span.
func (o *Observer) AcquireStart(ctx context.Context, a *guard.Acquisition) context.Context {
	k := o.kind(a)
	actx, span := o.tracer.Start(ctx, k.acquireName, k.spanAttrs[0], trace.WithTimestamp(a.Started))
	if span.IsRecording() {
		if kv, ok := o.nameAttr(a.Name); ok {
			span.SetAttributes(kv)
		}
		if a.MaxWait >= 0 {
			span.SetAttributes(MaxWaitKey.Float64(a.MaxWait.Seconds()))
		}
	}
	return context.WithValue(actx, startKey{}, ctx)
}

// AcquireEnd ends the acquire span and records the acquisition. When a lock was granted, it
// starts the hold span and returns a context that carries it, which the Guard makes the
// parent of the Lock's context.
func (o *Observer) AcquireEnd(ctx context.Context, a *guard.Acquisition, l *guard.Lock, err error) context.Context {
	start, ok := ctx.Value(startKey{}).(context.Context)
	if !ok {
		return ctx // not a context from AcquireStart: nothing of ours to end
	}
	k := o.kind(a)
	span := trace.SpanFromContext(ctx)
	recorded := span.IsRecording() // before End, after which no span records
	if recorded {
		span.SetAttributes(
			OutcomeKey.String(a.Outcome.String()),
			WaitKey.Float64(a.Waited.Seconds()),
			AttemptsKey.Int(a.Attempts),
			WakeupsKey.Int(a.Wakeups))
		if l != nil {
			span.SetAttributes(FenceKey.Int64(fence(l)))
		}
		if a.Outcome == guard.OutcomeError && err != nil {
			msg := o.message(a.Name, err)
			recordError(span, err, msg)
			span.SetStatus(codes.Error, msg)
		}
		span.End(trace.WithTimestamp(a.Started.Add(a.Waited)))
	} else {
		span.End()
	}

	i := outcomeIndex(a.Outcome)
	o.waitTime.Record(ctx, a.Waited.Seconds(), k.outcomeWait[i]...)
	o.acquisitions.Add(ctx, 1, k.outcome[i]...)
	if a.Kind == guard.KindWrite {
		o.writerWait.Record(ctx, a.Waited.Seconds(), k.outcomeWait[i]...)
	}
	if l == nil {
		return ctx
	}

	// The hold starts when the backend granted the lock, a moment before this call. When the
	// acquire span was not recorded, the hold span (same parent, same sampler) most likely is
	// not either: then spare the timestamp's allocation.
	var hctx context.Context
	var hspan trace.Span
	if recorded {
		hctx, hspan = o.tracer.Start(start, k.holdName, k.spanAttrs[0], trace.WithTimestamp(l.AcquiredAt()))
	} else {
		hctx, hspan = o.tracer.Start(start, k.holdName, k.spanAttrs...)
	}
	if hspan.IsRecording() {
		hspan.SetAttributes(FenceKey.Int64(fence(l)))
		if kv, ok := o.nameAttr(a.Name); ok {
			hspan.SetAttributes(kv)
		}
		if !trace.SpanContextFromContext(start).IsValid() {
			// No trace to join: this one starts a trace; link it to the acquisition's.
			hspan.AddLink(trace.Link{SpanContext: span.SpanContext()})
		}
	}
	h := &holding{k: k, span: hspan, recorded: hspan.IsRecording()}
	h.counted.Store(true)
	o.count(ctx, k, 1)
	if k.lock == guard.KindTerm {
		o.terms.Add(ctx, 1, k.base...)
	}
	return context.WithValue(hctx, holdKey{}, h)
}

// count adds n to the instruments that count the locks of k held: guard.lock.held, and
// guard.lock.permits.used or guard.lock.readers for the primitives that have one.
func (o *Observer) count(ctx context.Context, k *kind, n int64) {
	o.held.Add(ctx, n, k.base...)
	switch k.lock {
	case guard.KindPermit:
		o.permitsUsed.Add(ctx, n, k.base...)
	case guard.KindRead:
		o.readers.Add(ctx, n, k.base...)
	}
}

// LockEvent adds renewals, failures, extensions and loss to the hold span as events, and at
// release records the release span and ends the hold span.
func (o *Observer) LockEvent(l *guard.Lock, e guard.LockEvent) {
	ctx := l.Context()
	h, ok := ctx.Value(holdKey{}).(*holding)
	if !ok {
		return
	}
	k := h.k
	switch e.Kind {
	case guard.EventRenewed, guard.EventExtended:
		if h.span.IsRecording() {
			h.span.AddEvent(eventName(e.Kind), trace.WithTimestamp(e.At),
				trace.WithAttributes(DeadlineKey.String(e.Deadline.Format(time.RFC3339Nano))))
		}
	case guard.EventRenewFailed:
		o.renewFailures.Add(ctx, 1, k.base...)
		if h.span.IsRecording() {
			h.span.AddEvent(eventName(e.Kind), trace.WithTimestamp(e.At),
				trace.WithAttributes(ErrorKey.String(o.errText(l, e.Err)),
					DeadlineKey.String(e.Deadline.Format(time.RFC3339Nano))))
		}
	case guard.EventLost, guard.EventLeaseExpired:
		opts := k.lost
		if e.Kind == guard.EventLeaseExpired {
			opts = k.expired
		}
		o.losses.Add(ctx, 1, opts...)
		if h.counted.CompareAndSwap(true, false) {
			o.count(ctx, k, -1)
		}
		// The lock is held no more: the hold span ends here, whether or not the work ever
		// releases it.
		if h.span.IsRecording() {
			msg := o.errText(l, e.Err)
			h.span.AddEvent(eventName(e.Kind), trace.WithTimestamp(e.At),
				trace.WithAttributes(ErrorKey.String(msg)))
			h.span.SetStatus(codes.Error, msg)
			h.span.End(trace.WithTimestamp(e.At))
		} else {
			h.span.End()
		}
	case guard.EventReleased:
		start := e.At.Add(-e.Duration)
		o.holdTime.Record(ctx, start.Sub(l.AcquiredAt()).Seconds(), k.baseRecord...)
		if h.counted.CompareAndSwap(true, false) {
			o.count(ctx, k, -1)
		}
		if h.recorded {
			_, rspan := o.tracer.Start(ctx, k.releaseName, trace.WithTimestamp(start), k.spanAttrs[0])
			if e.Err != nil {
				msg := o.errText(l, e.Err)
				recordError(rspan, e.Err, msg)
				rspan.SetStatus(codes.Error, msg)
			}
			rspan.End(trace.WithTimestamp(e.At))
			h.span.End(trace.WithTimestamp(e.At))
		} else {
			h.span.End()
		}
	}
}

// nameAttr returns the name attribute of name as the name policy says: the name or its hash,
// or false when names are dropped.
func (o *Observer) nameAttr(name string) (attribute.KeyValue, bool) {
	switch o.names {
	case NameRaw:
		return NameKey.String(name), true
	case NameHashed:
		return NameKey.String(HashName(name)), true
	}
	return attribute.KeyValue{}, false
}

// HashName returns what NameHashed records of name: the first 16 hex digits (64 bits) of
// its SHA-256. Use it to find the spans of a name you know.
func HashName(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:8])
}

// fence returns l's fence as an attribute value. Fences count acquisitions, so they stay far
// below 2⁶³; a larger one is clamped rather than shown negative.
func fence(l *guard.Lock) int64 {
	f := l.Fence()
	if f > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(f)
}

// eventNames are the span event names, by guard.EventKind.
var eventNames = [...]string{
	guard.EventRenewed:      "guard.lock.renewed",
	guard.EventRenewFailed:  "guard.lock.renew_failed",
	guard.EventLost:         "guard.lock.lost",
	guard.EventLeaseExpired: "guard.lock.lease_expired",
	guard.EventExtended:     "guard.lock.extended",
	guard.EventReleased:     "guard.lock.released",
}

func eventName(k guard.EventKind) string {
	if k < 0 || int(k) >= len(eventNames) {
		return "guard.lock.unknown"
	}
	return eventNames[k]
}

// errText returns the text of err, an error about l, as the name policy says (message).
func (o *Observer) errText(l *guard.Lock, err error) string {
	if err == nil {
		return ""
	}
	return o.message(l.Name(), err)
}
