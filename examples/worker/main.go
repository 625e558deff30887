// Command worker runs several instances of one service, each with its own Guard on one shared
// lock backend, through guard's worker patterns:
//
//   - a scheduled job that must run once per window across the instances: a gocron v2
//     scheduler in every instance, with a gocronlock.Locker whose hold window is
//     guard.MinHold(window/2), by the rule of the scheduling guide. Every instance's scheduler
//     fires it at every tick, a little late by its own clock; the first runs it, the others
//     find the window taken;
//   - a batch of tasks, each locked by its ID: decorators.MustFunc with "task:{Run}:{ID}".
//     Every instance walks the whole batch and skips the tasks that are busy (another
//     instance holds them) or done; then it waits for the busy ones, and finds them done;
//   - a limit per tenant on the tasks that run at once: each task belongs to a tenant (-tenants)
//     and runs its import under a permit of a guard.Semaphore of -imports permits for that
//     tenant, so that no more than -imports of a tenant's tasks run at once across every
//     process. The backend must grant shared holds (guard.Sharing); on one that does not, the
//     tasks run without the limit, and the program says so;
//   - a maintenance loop that one instance runs at a time, the leader of a guard.Election:
//     every instance campaigns, the leader runs a round every window and checks its term
//     before each (Election.Check, what a liveness probe would call), one instance of each
//     process logs every change of leader (Election.Observe), and when the leader stops,
//     another takes over.
//
// What makes a task done is a record in a journal that every instance shares, kept on the
// server the locks are on (Redis keys, SQL tables worker_runs, worker_events and worker_tasks,
// MongoDB collections of those names, etcd keys under guard-example/worker/; memory for the
// embedded backend). Under the task's lock
// an instance claims the task with its lock's fence and, once the task is done, records it
// done with the same fence; the journal refuses the record of a fence older than the last
// claim, or of a task already done. A lock keeps two instances off one task at once; the
// fence keeps out the record of an instance that paused past its lease while another took the
// task over; the record keeps a finished task from running again. Each run of the job, each
// round of maintenance and each time an instance found a lock busy are recorded there too.
//
// The names of the job's lock, the tasks' locks, the semaphores and the election carry the
// run's ID: runs on one backend, one after another or at once, share nothing.
//
// By default it runs a short demonstration — 3 instances, 4 windows of 1 s, 24 tasks of 3
// tenants, 2 imports of a tenant at once — on the embedded in-process backend, prints which
// instance ran each window and each task, how many tasks of each tenant ran at once and who
// led the maintenance, and exits 0 when every window and every task ran exactly once, no
// tenant ran more tasks at once than its permits and no two leaders ran maintenance at once;
// 1 otherwise, saying whether the locks failed or the process met errors of its own (a store
// that did not answer). The verdict is read from
// the journal, so it covers every process on the backend: start the program two or three
// times at once on one server and each process joins one run (the first to come records it,
// under a lock), runs its share, and prints the same verdict.
//
// The program is a module of its own (it links etcd's client), run from its directory:
//
//	cd examples/worker
//	go run .
//	go run . -timeline timeline.svg          # and draw the run
//	go run . -redis 127.0.0.1:6379 & go run . -redis 127.0.0.1:6379
//	go run . -forever -redis 127.0.0.1:6379  # until interrupted
//
// -redis, -mongo, -etcd (or GUARD_REDIS_ADDR, GUARD_MONGO_URI, GUARD_ETCD_ENDPOINTS),
// -postgres and -mysql select the backend; -trace-stdout prints every span, and
// OTEL_EXPORTER_OTLP_ENDPOINT exports them, as for the httpapi example:
//
//	go run . -postgres postgres://app:secret@127.0.0.1/app
//	go run . -mysql 'app:secret@tcp(127.0.0.1:3306)/app'
//	go run . -etcd 127.0.0.1:2379,127.0.0.1:22379,127.0.0.1:32379
//	go run . -trace-stdout -tasks 3
//
// The program imports only guard's public packages: copy the directory, go.mod included, into
// a project of yours, and drop the go.mod's replace directives once you require a released
// guard.
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
	"sync"
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
	fs.IntVar(&cfg.instances, "instances", 3, "how many instances of the service this process runs")
	fs.IntVar(&cfg.windows, "windows", 4, "how many windows of the job to run")
	fs.DurationVar(&cfg.window, "window", time.Second, "run the job once per `window`")
	fs.IntVar(&cfg.tasks, "tasks", 24, "how many tasks a batch has")
	fs.DurationVar(&cfg.work, "work", 250*time.Millisecond, "how long a task takes on average")
	fs.IntVar(&cfg.tenants, "tenants", 3, "how many tenants the tasks belong to")
	fs.IntVar(&cfg.imports, "imports", 2, "how many tasks of one tenant may run at once, across processes (a guard.Semaphore per tenant); 0: no limit")
	lease := fs.Duration("lease", guard.DefaultWatchdogTimeout,
		"the lease of every lock, renewed by the watchdog every third of it (guard.WithWatchdogTimeout): how long a stopped process keeps its tasks")
	forever := fs.Bool("forever", false, "run until interrupted, with a new batch every window")
	timeline := fs.String("timeline", "", "write an SVG timeline of the run to `path`")
	traceStdout := fs.Bool("trace-stdout", false, "print every span to stdout as it ends")
	var flags backendFlags
	flags.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case cfg.instances < 1 || cfg.windows < 1 || cfg.tenants < 1 || cfg.tasks < 0 || cfg.work < 0 || cfg.imports < 0:
		return errors.New("-instances, -windows and -tenants must be at least 1, -tasks, -work and -imports not negative")
	case cfg.window < 100*time.Millisecond:
		return errors.New("-window must be at least 100ms")
	case *lease < 100*time.Millisecond:
		return errors.New("-lease must be at least 100ms")
	}
	if *forever {
		cfg.windows = 0
	}

	var printSpans io.Writer
	if *traceStdout {
		// The spans of releases still under way and the summary write to it at once.
		stdout = &syncWriter{w: stdout}
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
	log.Info("lock backend and journal: " + b.desc)
	if b.desc == inProcess {
		log.Info("locks and the journal are shared inside this process only; give -redis, -mongo, -postgres, -mysql or -etcd to share them between processes")
	}
	guards := make([]*guard.Guard, cfg.instances) // one per instance, as each instance of a service has its own; traced
	for i := range guards {
		guards[i] = guard.New(b.locks, guard.WithObserver(tracing.New()), guard.WithWatchdogTimeout(*lease))
	}
	defer func() {
		// The order that loses nothing: release the locks, disconnect, export the last spans.
		var errs []error
		for _, g := range guards {
			errs = append(errs, within(g.Close))
		}
		cerr := errors.Join(append(errs, b.disconnect(), flush())...)
		if cerr == nil {
			log.Info("closed: locks released, backend disconnected, spans flushed")
		}
		err = errors.Join(err, cerr)
	}()

	r, err := join(ctx, guards[0], b.journal, cfg)
	if err != nil {
		return fmt.Errorf("joining a run: %w", err)
	}
	p := newProcess(cfg, r, b.journal, log)
	if r.Windows > 0 {
		log.Info(fmt.Sprintf("run %s: window 0 starts at %s; this process takes part from window %d", r.ID,
			r.Epoch.Format("15:04:05.000"), p.first))
	}
	log.Info(fmt.Sprintf("%d instances: job %q every %v, and a batch of %d tasks %q", cfg.instances, r.jobLock(),
		cfg.window, cfg.tasks, taskTemplate))
	p.demo(ctx, guards)
	return p.verdict(ctx, stdout, b.desc, *timeline)
}

// syncWriter serialises the writes to w.
type syncWriter struct {
	mu sync.Mutex // serialises the writes
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// verdict waits for the end of the run, reads what every process ran from the journal,
// prints the summary to stdout, draws the timeline when asked, and says whether every window
// and every task ran exactly once — or, for a run with no end or one that ctx cut short, that
// none ran twice. It tells the locks' failures (a window or a task that ran twice, or did not
// run) from this process's errors (a store that did not answer, say): it returns an error
// for either, and says which.
func (p *process) verdict(ctx context.Context, stdout io.Writer, desc, timeline string) error {
	r := p.run
	first, last := p.first, r.window(time.Now())+1 // without an end: the windows this process saw
	if r.Windows > 0 {
		// The other processes' instances fire the last window a little later than ours:
		// read the journal once it has ended.
		_ = pause(ctx, time.Until(r.end()))
		first, last = 0, int64(r.Windows)
	}
	complete := r.Windows > 0 && ctx.Err() == nil
	// Read the journal even when ctx has ended: the verdict of what ran.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	events, err := p.j.events(rctx, r.ID)
	cancel()
	if err != nil {
		return fmt.Errorf("reading the journal: %w", err)
	}
	o := newOutcome(r, events, first, last)
	p.mu.Lock()
	o.failed = p.failed
	errs := errors.Join(p.errs...)
	p.mu.Unlock()
	unlimited := !p.limited && r.Imports > 0
	if unlimited {
		o.run.Imports = 0 // nothing to check
	}
	o.summarize(stdout, p.cfg, desc, p.pid)
	if unlimited {
		fmt.Fprintln(stdout, "imports: no limit per tenant: the backend grants no shared holds (guard.Sharing)")
	}
	fmt.Fprintf(stdout, "\nthis process ran %d of %d windows and %d of %d tasks\n",
		p.windows.Load(), len(o.runs(jobRun)), p.tasks.Load(), len(o.runs(taskRun)))
	if n := p.stale.Load(); n > 0 {
		fmt.Fprintf(stdout, "this process's instances lost %d task locks while they ran them: the journal refused their done records\n", n)
	}
	if timeline != "" {
		if err := writeTimelineFile(timeline, o, p.cfg, desc, complete); err != nil {
			return err
		}
		p.log.Info("timeline written to " + timeline)
	}
	failed := o.check(complete)
	if failed != nil {
		fmt.Fprintf(stdout, "\nFAILED:\n%v\n", failed)
	}
	if errs != nil {
		fmt.Fprintf(stdout, "\nERRORS of this process (not of the locks: the windows and tasks they cut short are not counted above):\n%v\n", errs)
	}
	switch {
	case failed != nil:
		return errors.New(broken(failed))
	case errs != nil:
		return errors.New("no window and no task ran twice, but this process met errors")
	case complete:
		fmt.Fprintln(stdout, "\nOK: every window ran exactly once, and every task ran exactly once.")
	default:
		fmt.Fprintln(stdout, "\nOK: no window and no task ran twice.")
	}
	return nil
}
