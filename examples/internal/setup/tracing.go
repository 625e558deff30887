package setup

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// The standard OpenTelemetry variables that turn tracing on: the OTLP endpoint of all
// signals, or of traces alone. They hold a URL, such as http://127.0.0.1:4318 (Jaeger's
// OTLP/HTTP port).
const (
	EndpointEnv       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	TracesEndpointEnv = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

// Tracing installs an OpenTelemetry SDK TracerProvider as the global one when EndpointEnv or
// TracesEndpointEnv is set: spans go through a batch span processor to an OTLP/HTTP exporter
// configured by the standard OTEL_EXPORTER_OTLP_* variables, under the service name service
// (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it), and W3C trace context is
// propagated. Otherwise it installs nothing and the global provider stays a no-op.
//
// It returns a description for the log and shutdown, which flushes the spans still queued and
// stops the exporter: call it last, after the Guards are closed, so that their release spans
// are exported too.
func Tracing(ctx context.Context, service string) (shutdown func(context.Context) error, description string, err error) {
	endpoint := os.Getenv(TracesEndpointEnv)
	if endpoint == "" {
		endpoint = os.Getenv(EndpointEnv)
	}
	if endpoint == "" {
		return func(context.Context) error { return nil },
			"tracing off (set " + EndpointEnv + ", e.g. http://127.0.0.1:4318, to export spans over OTLP/HTTP)", nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("setup: OTLP trace exporter: %w", err)
	}
	// The environment's resource wins over the default service name.
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName(service)), resource.Environment())
	if err != nil {
		return nil, "", fmt.Errorf("setup: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	name, _ := res.Set().Value(semconv.ServiceNameKey)
	return tp.Shutdown, fmt.Sprintf("tracing: OTLP/HTTP to %s as service %s", endpoint, name.Emit()), nil
}
