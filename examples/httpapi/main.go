// Command httpapi is a small account service whose deposits and withdrawals each hold a
// distributed lock on their account, declared on the routes with middleware.Lock (see package
// accounts). It runs with no server at all, on the embedded in-process backend, or on Redis,
// MongoDB, PostgreSQL or MySQL/MariaDB shared by several instances, and traces every request
// and lock over OTLP/HTTP when asked:
//
//	go run ./examples/httpapi                                   # in-process backend
//	go run ./examples/httpapi -redis 127.0.0.1:6379             # or GUARD_REDIS_ADDR
//	go run ./examples/httpapi -mongo mongodb://127.0.0.1/app    # or GUARD_MONGO_URI
//	go run ./examples/httpapi -postgres postgres://app:secret@127.0.0.1/app
//	go run ./examples/httpapi -mysql 'app:secret@tcp(127.0.0.1:3306)/app'
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 go run ./examples/httpapi
//
// With -postgres or -mysql it creates the lock table, guard_locks, when it is missing. Then:
//
//	curl -H 'X-Tenant: acme' -d '{"amount": 100}' localhost:8080/accounts/42/deposit
//	curl -H 'X-Tenant: acme' -d '{"amount": 30}'  localhost:8080/accounts/42/withdraw
//	curl -H 'X-Tenant: acme' localhost:8080/accounts/42
//
// SIGINT or SIGTERM shuts it down gracefully: it finishes the requests in flight, releases
// the locks it holds, and flushes the spans.
//
// The program imports only guard's public packages and its own package accounts: copy the
// directory into a module of yours and change that one import path.
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/examples/httpapi/accounts"
	"github.com/guardlock/guard/tracing"
)

// service is the program's OpenTelemetry service name.
const service = "guard-httpapi"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := run(ctx, os.Args[1:], log, nil)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		log.Error(err.Error())
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down. It calls ready, when not nil, with the address
// it listens on.
func run(ctx context.Context, args []string, log *slog.Logger, ready func(net.Addr)) (err error) {
	fs := flag.NewFlagSet("httpapi", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen on `host:port`")
	work := fs.Duration("work", 50*time.Millisecond,
		"how long a deposit or withdrawal takes between reading and writing the balance")
	var backend backendFlags
	backend.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}

	flush, desc, err := startTracing(ctx, service)
	if err != nil {
		return err
	}
	log.Info(desc)
	store, desc, disconnect, err := backend.open(ctx)
	if err != nil {
		return errors.Join(err, flush())
	}
	log.Info("lock backend: " + desc)
	if desc == inProcess {
		log.Info("locks are shared inside this process only; give -redis, -mongo, -postgres or -mysql to share them between processes")
	}
	g := guard.New(store, guard.WithObserver(tracing.New()))
	defer func() {
		// The order that loses nothing: release the locks, disconnect, export the last spans.
		cerr := errors.Join(within(g.Close), disconnect(), flush())
		if cerr == nil {
			log.Info("closed: locks released, backend disconnected, spans flushed")
		}
		err = errors.Join(err, cerr)
	}()

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
	err = within(srv.Shutdown)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
