// Command httpapi is a small account service with a distributed read-write lock per account,
// declared on the routes with middleware.Lock and middleware.ReadWrite (see handler.go):
// deposits and withdrawals hold it alone, balance reads share it. It runs with no server at
// all, on the embedded in-process backend, or on Redis, MongoDB, PostgreSQL, MySQL/MariaDB or
// etcd shared by several instances. The balances live where the locks do — a hash per account
// on Redis, the table httpapi_accounts on PostgreSQL and MySQL, the collection
// httpapi_accounts on MongoDB, a key per account on etcd, memory for the embedded backend —
// so that every instance of the service sees every other's writes. The program is a module of
// its own (it links etcd's client), run from its directory:
//
//	cd examples/httpapi
//	go run .                                   # in-process backend
//	go run . -redis 127.0.0.1:6379             # or GUARD_REDIS_ADDR
//	go run . -mongo mongodb://127.0.0.1/app    # or GUARD_MONGO_URI
//	go run . -postgres postgres://app:secret@127.0.0.1/app
//	go run . -mysql 'app:secret@tcp(127.0.0.1:3306)/app'
//	go run . -etcd 127.0.0.1:2379              # or GUARD_ETCD_ENDPOINTS; host:port,host:port… for a cluster
//
// With -postgres or -mysql it creates its tables, guard_locks and httpapi_accounts, when they
// are missing. -trace-stdout prints every span as it ends, one line each, and
// OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 exports them to Jaeger or another OTLP
// collector. Then:
//
//	curl -H 'X-Tenant: acme' -d '{"amount": 100}' localhost:8080/accounts/42/deposit
//	curl -H 'X-Tenant: acme' -d '{"amount": 30}'  localhost:8080/accounts/42/withdraw
//	curl -H 'X-Tenant: acme' localhost:8080/accounts/42
//
// Run two or three with -addr 127.0.0.1:8081 and so on, on one server: a deposit through one
// is seen by the others, withdrawals through all of them never overdraw the account, and a
// balance read through any of them never answers from the middle of a withdrawal.
//
// SIGINT or SIGTERM shuts it down gracefully: it finishes the requests in flight, releases
// the locks it holds, and flushes the spans.
//
// The program is this one directory and imports only guard's public packages: copy it, go.mod
// included, into a project of yours, and drop the go.mod's replace directives once you require
// a released guard.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/tracing"
)

// service is the program's OpenTelemetry service name.
const service = "guard-httpapi"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := run(ctx, os.Args[1:], os.Stdout, log, nil)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		log.Error(err.Error())
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down. It calls ready, when not nil, with the address
// it listens on. Spans printed with -trace-stdout go to stdout.
func run(ctx context.Context, args []string, stdout io.Writer, log *slog.Logger, ready func(net.Addr)) (err error) {
	fs := flag.NewFlagSet("httpapi", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen on `host:port`")
	wait := fs.Duration("wait", DefaultWaitTime,
		"how long a request waits for its account's lock (a read for its read side) before it is answered 423 Locked")
	work := fs.Duration("work", 50*time.Millisecond,
		"how long a deposit or withdrawal takes between reading and writing the balance")
	traceStdout := fs.Bool("trace-stdout", false, "print every span to stdout as it ends")
	var flags backendFlags
	flags.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *wait < 0 {
		return errors.New("-wait must not be negative")
	}
	if err := serverTimeouts.checkWait(*wait, *work); err != nil {
		return err
	}

	var printSpans io.Writer
	if *traceStdout {
		printSpans = stdout
	}
	flush, desc, err := startTracing(ctx, service, printSpans)
	if err != nil {
		return err
	}
	log.Info(desc)
	b, err := flags.open(ctx)
	if err != nil {
		return errors.Join(err, flush())
	}
	log.Info("lock backend and balances: " + b.desc)
	if b.desc == inProcess {
		log.Info("locks and balances are shared inside this process only; give -redis, -mongo, -postgres, -mysql or -etcd to share them between processes")
	}
	g := guard.New(b.locks, guard.WithObserver(tracing.New()))
	defer func() {
		// The order that loses nothing: release the locks, disconnect, export the last spans.
		cerr := errors.Join(within(g.Close), b.disconnect(), flush())
		if cerr == nil {
			log.Info("closed: locks released, backend disconnected, spans flushed")
		}
		err = errors.Join(err, cerr)
	}()
	if b.setup != nil {
		// Instances that start together would race to create the table: one at a time.
		sctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err := g.Do(sctx, "httpapi:setup", b.setup, guard.WaitTime(connectTimeout))
		cancel()
		if err != nil {
			return fmt.Errorf("creating the accounts table: %w", err)
		}
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := newServer(NewHandler(g, b.store, WithWork(*work), WithWaitTime(*wait)), serverTimeouts)
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

// timeouts are the HTTP server's.
type timeouts struct {
	readHeader, read, write, idle time.Duration
}

// serverTimeouts bound every phase of a request, which matters more than usual on a server
// whose routes hold locks. A route behind middleware.Lock holds its account's lock while the
// handler runs; a client that sends its headers, or its body, a byte at a time would keep the
// handler — and the lock, and every other request on that account — waiting for as long as it
// likes. So:
//
//   - ReadHeaderTimeout: the headers arrive within 5 s;
//   - ReadTimeout: the whole request, body included, within 10 s of when the server began to
//     read it: a body that has not arrived by then fails to read, and the handler answers
//     at once;
//   - WriteTimeout: the response is written within 30 s of the end of the headers. That
//     covers the body (up to ReadTimeout), the wait for the lock (-wait) and the work
//     (-work), with writeRoom left for the store's round trips and the response: run refuses
//     a -wait and a -work that add up to more than 15 s, which the server would cut off
//     mid-wait;
//   - IdleTimeout: a kept-alive connection with no request is closed after 60 s.
var serverTimeouts = timeouts{readHeader: 5 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: 60 * time.Second}

// writeRoom is what the write timeout leaves, beyond the body, the wait for the lock and the
// work, for the store's round trips and writing the response.
const writeRoom = 5 * time.Second

// checkWait returns an error when a request whose body took the whole read timeout, that then
// waits wait for its lock and works for work, could outlast t's write timeout: the server
// would cut it off while it waits.
func (t timeouts) checkWait(wait, work time.Duration) error {
	if most := t.write - t.read - writeRoom; wait+work > most {
		return fmt.Errorf("-wait %v and -work %v add up to more than %v: the server's WriteTimeout (%v) would cut a request off while it waits, "+
			"after reading its body (up to %v); give a shorter -wait", wait, work, most, t.write, t.read)
	}
	return nil
}

// newServer returns the HTTP server of h with the timeouts t.
func newServer(h http.Handler, t timeouts) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.readHeader,
		ReadTimeout:       t.read,
		WriteTimeout:      t.write,
		IdleTimeout:       t.idle,
	}
}
