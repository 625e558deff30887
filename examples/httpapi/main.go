// Command httpapi is a small account service whose deposits and withdrawals each hold a
// distributed lock on their account, declared on the routes with middleware.Lock (see package
// accounts). It runs with no server at all, on the embedded in-process backend, or on Redis
// or MongoDB shared by several instances, and traces every request and lock over OTLP/HTTP
// when asked:
//
//	go run ./examples/httpapi                                   # in-process backend
//	go run ./examples/httpapi -redis 127.0.0.1:6379             # or GUARD_REDIS_ADDR
//	go run ./examples/httpapi -mongo mongodb://127.0.0.1/app    # or GUARD_MONGO_URI
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 go run ./examples/httpapi
//
// Then:
//
//	curl -H 'X-Tenant: acme' -d '{"amount": 100}' localhost:8080/accounts/42/deposit
//	curl -H 'X-Tenant: acme' -d '{"amount": 30}'  localhost:8080/accounts/42/withdraw
//	curl -H 'X-Tenant: acme' localhost:8080/accounts/42
//
// SIGINT or SIGTERM shuts it down gracefully: it finishes the requests in flight, releases
// the locks it holds, and flushes the spans.
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/guardlock/guard/examples/httpapi/accounts"
	"github.com/guardlock/guard/examples/internal/setup"
)

// service is the program's OpenTelemetry service name.
const service = "guard-httpapi"

func main() {
	setup.Main(func(ctx context.Context, log *slog.Logger) error { return run(ctx, os.Args[1:], log, nil) })
}

// run serves until ctx ends, then shuts down. It calls ready, when not nil, with the address
// it listens on.
func run(ctx context.Context, args []string, log *slog.Logger, ready func(net.Addr)) (err error) {
	fs := flag.NewFlagSet("httpapi", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen on `host:port`")
	work := fs.Duration("work", 50*time.Millisecond,
		"how long a deposit or withdrawal takes between reading and writing the balance")
	backend := setup.BackendFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}

	p, err := setup.Start(ctx, service, *backend, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Close()) }()
	g := p.Guard()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           accounts.NewHandler(g, &accounts.Ledger{}, accounts.WithWork(*work)),
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening on http://" + ln.Addr().String())
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing the requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), setup.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
