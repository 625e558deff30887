package setup

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/tracing"
)

// Variables returns the environment variables that Start reads, for tests that clear them.
func Variables() []string {
	return []string{RedisEnv, MongoEnv, EndpointEnv, TracesEndpointEnv, "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"}
}

// ShutdownTimeout bounds each step of Program.Close.
const ShutdownTimeout = 10 * time.Second

// Program is what an example program runs on: a lock backend, the tracing set up for it, and
// the Guards it made. Make one with Start; Close it last.
type Program struct {
	backend    guard.Backend
	desc       string
	disconnect func(context.Context) error
	flush      func(context.Context) error
	log        *slog.Logger

	mu     sync.Mutex // protects guards
	guards []*guard.Guard
}

// Start sets up tracing for service (see Tracing), then opens the backend that b selects (see
// Backend.Open), and logs what it chose.
func Start(ctx context.Context, service string, b Backend, log *slog.Logger) (*Program, error) {
	flush, desc, err := Tracing(ctx, service)
	if err != nil {
		return nil, err
	}
	log.Info(desc)
	backend, desc, disconnect, err := b.Open(ctx)
	if err != nil {
		return nil, errors.Join(err, within(flush))
	}
	log.Info("lock backend: " + desc)
	if desc == InProcess {
		log.Info("locks are shared inside this process only; give -redis or -mongo to share them between processes")
	}
	return &Program{backend: backend, desc: desc, disconnect: disconnect, flush: flush, log: log}, nil
}

// BackendDescription describes the program's backend, as Backend.Open does.
func (p *Program) BackendDescription() string { return p.desc }

// Guard returns a new Guard on the program's backend — a service instance — whose locks are
// traced (package tracing, on the global TracerProvider). Close closes it.
func (p *Program) Guard(opts ...guard.Option) *guard.Guard {
	g := guard.New(p.backend, append([]guard.Option{guard.WithObserver(tracing.New())}, opts...)...)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.guards = append(p.guards, g)
	return g
}

// Close shuts down in the order that loses nothing: it closes the Guards, which releases the
// locks they hold; then disconnects the backend; then flushes the spans still queued. Each
// step gets ShutdownTimeout. It returns the errors of all three.
func (p *Program) Close() error {
	p.mu.Lock()
	guards := p.guards
	p.guards = nil
	p.mu.Unlock()
	var errs []error
	for _, g := range guards {
		errs = append(errs, within(g.Close))
	}
	errs = append(errs, within(p.disconnect), within(p.flush))
	err := errors.Join(errs...)
	if err == nil {
		p.log.Info("closed: locks released, backend disconnected, spans flushed")
	}
	return err
}

// within calls f with a context that ends after ShutdownTimeout.
func within(f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	return f(ctx)
}
