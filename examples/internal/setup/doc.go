// Package setup is what the example programs share, so that each program is only its own
// logic: the lock backend that flags or the environment select (Redis, MongoDB, or the
// embedded in-process default), OpenTelemetry tracing over OTLP/HTTP when the standard
// environment variable asks for it, and the shutdown that releases the locks before it
// disconnects and flushes the spans.
//
//	func main() { setup.Main(func(ctx context.Context, log *slog.Logger) error { … }) }
//
//	backend := setup.BackendFlags(fs)  // -redis, -mongo
//	p, err := setup.Start(ctx, "guard-worker", *backend, log)
//	defer p.Close()
//	g := p.Guard()                     // traced, closed by p.Close
package setup
