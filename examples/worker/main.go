// Command worker runs several instances of one service, each with its own Guard on one shared
// lock backend, through guard's two worker patterns:
//
//   - a scheduled job that must run once per window across the instances: a gocron v2
//     scheduler in every instance, with a gocronlock.Locker whose hold window is
//     guard.MinHold(window/2) (docs/scheduling.md). Every instance's scheduler fires it at
//     every tick, a little late by its own clock; the first runs it, the others find the
//     window taken;
//   - a batch of tasks, each locked by its ID: decorators.MustFunc with "task:{ID}". Every
//     instance walks the whole batch and skips the tasks that are busy (another instance
//     holds them) or done (a done set, checked under the lock).
//
// By default it runs a short demonstration — 3 instances, 4 windows of 1 s, 24 tasks — on the
// embedded in-process backend, prints which instance ran each window and each task, and exits
// 0 when every window and every task ran exactly once (1 otherwise):
//
//	go run ./examples/worker
//	go run ./examples/worker -timeline timeline.svg          # and draw the run
//	go run ./examples/worker -forever -redis 127.0.0.1:6379  # until interrupted
//
// -redis, -mongo (or GUARD_REDIS_ADDR, GUARD_MONGO_URI), -postgres and -mysql select the
// backend, and OTEL_EXPORTER_OTLP_ENDPOINT turns on tracing, as for the httpapi example:
//
//	go run ./examples/worker -postgres postgres://app:secret@127.0.0.1/app
//	go run ./examples/worker -mysql 'app:secret@tcp(127.0.0.1:3306)/app'
//
// The program imports only guard's public packages: copy the directory into a module of yours.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/tracing"
)

// service is the program's OpenTelemetry service name.
const service = "guard-worker"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := run(ctx, os.Args[1:], os.Stdout, log)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		log.Error(err.Error())
		os.Exit(1)
	}
}

// run runs the demonstration, or with -forever runs until ctx ends, and prints the summary
// to stdout. It returns an error when a window or a task ran twice, or, in a demonstration
// that ran to its end, not at all.
func run(ctx context.Context, args []string, stdout io.Writer, log *slog.Logger) (err error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var cfg config
	fs.IntVar(&cfg.instances, "instances", 3, "how many instances of the service run")
	fs.IntVar(&cfg.windows, "windows", 4, "how many windows of the job to run")
	fs.DurationVar(&cfg.window, "window", time.Second, "run the job once per `window`")
	fs.IntVar(&cfg.tasks, "tasks", 24, "how many tasks a batch has")
	fs.DurationVar(&cfg.work, "work", 250*time.Millisecond, "how long a task takes on average")
	forever := fs.Bool("forever", false, "run until interrupted, with a new batch every window")
	timeline := fs.String("timeline", "", "write an SVG timeline of the run to `path`")
	var backend backendFlags
	backend.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case cfg.instances < 1 || cfg.windows < 1 || cfg.tasks < 0 || cfg.work < 0:
		return errors.New("-instances and -windows must be at least 1, -tasks and -work not negative")
	case cfg.window < 100*time.Millisecond:
		return errors.New("-window must be at least 100ms")
	}
	if *forever {
		cfg.windows = 0
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
	var guards []*guard.Guard // one per instance; demo makes them on this goroutine
	defer func() {
		// The order that loses nothing: release the locks, disconnect, export the last spans.
		var errs []error
		for _, g := range guards {
			errs = append(errs, within(g.Close))
		}
		cerr := errors.Join(append(errs, disconnect(), flush())...)
		if cerr == nil {
			log.Info("closed: locks released, backend disconnected, spans flushed")
		}
		err = errors.Join(err, cerr)
	}()
	log.Info(fmt.Sprintf("%d instances: job %q every %v, and a batch of %d tasks %q", cfg.instances, jobName,
		cfg.window, cfg.tasks, taskTemplate))
	rec := demo(ctx, cfg, func() *guard.Guard {
		// One Guard per instance, as each instance of a service has its own; traced.
		g := guard.New(store, guard.WithObserver(tracing.New()))
		guards = append(guards, g)
		return g
	}, log)

	rec.summarize(stdout, desc)
	if *timeline != "" {
		if err := writeTimelineFile(*timeline, rec, desc); err != nil {
			return err
		}
		log.Info("timeline written to " + *timeline)
	}
	complete := cfg.windows > 0 && ctx.Err() == nil
	if err := rec.check(complete); err != nil {
		fmt.Fprintf(stdout, "\nFAILED:\n%v\n", err)
		return errors.New("a window or a task did not run exactly once")
	}
	if complete {
		fmt.Fprintln(stdout, "\nOK: every window ran exactly once, and every task ran exactly once.")
	} else {
		fmt.Fprintln(stdout, "\nOK: no window and no task ran twice.")
	}
	return nil
}
