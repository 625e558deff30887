package tracing_test

import (
	"context"
	"fmt"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/tracing"
)

// printTree prints spans as a tree, in the order they started.
func printTree(spans []sdktrace.ReadWriteSpan) {
	depth := map[trace.SpanID]int{}
	for _, s := range spans {
		d := 0
		if p, ok := depth[s.Parent().SpanID()]; ok && s.Parent().IsValid() {
			d = p + 1
		}
		depth[s.SpanContext().SpanID()] = d
		fmt.Println(strings.Repeat("  ", d) + s.Name())
	}
}

func ExampleNew() {
	// A program sets up the SDK with an exporter once, as the global TracerProvider, and
	// calls tracing.New() with no options. Here the spans stay in memory.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	g := guard.New(memstore.New(), guard.WithObserver(tracing.New(tracing.WithTracerProvider(tp))))
	defer func() { _ = g.Close(context.Background()) }()

	tracer := tp.Tracer("example")
	ctx, request := tracer.Start(context.Background(), "GET /reports/{day}")
	err := g.Do(ctx, "report:2024-05-01", func(ctx context.Context) error {
		_, render := tracer.Start(ctx, "render") // runs under the hold span
		defer render.End()
		return nil
	}, guard.Label("report:{day}"))
	request.End()
	if err != nil {
		fmt.Println(err)
	}

	printTree(spans.Started())
	// Output:
	// GET /reports/{day}
	//   guard.acquire report:{day}
	//   guard.hold report:{day}
	//     render
	//     guard.release report:{day}
}

func ExampleWithNames() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	// Lock names rendered from account numbers: record a hash, not the number.
	obs := tracing.New(tracing.WithTracerProvider(tp), tracing.WithNames(tracing.NameHashed))
	g := guard.New(memstore.New(), guard.WithObserver(obs))
	defer func() { _ = g.Close(context.Background()) }()

	const name = "withdraw:DE44500105175407324931"
	_ = g.Do(context.Background(), name, func(context.Context) error { return nil },
		guard.Label("withdraw:{iban}"))

	for _, s := range spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == tracing.NameKey {
				fmt.Println(s.Name(), kv.Value.AsString() == tracing.HashName(name))
			}
		}
	}
	// Output:
	// guard.acquire withdraw:{iban} true
	// guard.hold withdraw:{iban} true
}
