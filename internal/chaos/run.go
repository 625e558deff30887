package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/guardlock/guard/internal/testserver"
)

// Target is one backend deployment under test: how the workers reach it, the names they
// contend for, and the faults the coordinator can inject. A nil fault function means the
// deployment does not support that fault.
type Target struct {
	Backend string   // its name in reports
	Conn    Conn     // what the workers dial
	Names   []string // the lock names to contend for: 1 to 3, so that overlaps would show

	// Proxy is the FaultProxy between the workers and the server (in a cluster, one node).
	Proxy *testserver.FaultProxy
	// Requests recognise the lock operations' requests, for the faults that lose or delay
	// the reply to one of them.
	Requests []func(request []byte) bool

	Pause, Resume func(testing.TB) // SIGSTOP and SIGCONT the server
	// Isolate cuts one server of a consensus cluster off from its peers (its leader,
	// whose loss costs most), and Rejoin lets it back.
	Isolate, Rejoin func(testing.TB)
	Crash           func(testing.TB) // kill -9 the server and restart it with its data
	// CrashLosingData kills the server and restarts it without its data (no persistence);
	// it returns the names whose data was lost.
	CrashLosingData func(testing.TB) []string
}

// Options configure Run.
type Options struct {
	Seed     uint64        // every random choice of the run derives from it
	Duration time.Duration // how long faults are injected
	Workers  int           // worker processes at any time; at least 4
	Loops    int           // goroutines contending in each worker process; at least 1
	NoFaults bool          // inject nothing: the workers just run for Duration
	// The run goes on past Duration until it has seen MinAcquisitions grants and injected
	// MinFaults faults, but no longer than MaxDuration.
	MinAcquisitions, MinFaults int
	MaxDuration                time.Duration
}

// Timings of a run.
const (
	// minLease is the shortest watchdog timeout and LeaseTime of the workers: a lease of
	// 600 ms has 8 ms of drift margin (1% + 2 ms), which a loaded machine must still meet.
	minLease = 600 * time.Millisecond
	// maxLease is the longest; a worker is stopped for longer than that to outlive its lease.
	maxLease = 1200 * time.Millisecond
	// stopTimeout bounds how long a worker may take to release its lock and exit when told.
	stopTimeout = 30 * time.Second
)

// The primitives every run exercises besides the target's mutex names, on a backend that
// grants shared holds: a semaphore of semPermits permits and a read-write lock.
const (
	semName    = "chaos-sem"
	semPermits = 2
	rwName     = "chaos-rw"
)

// Run runs one chaos run against target and returns what Check found, with the run's figures.
// It fails tb for failures of the harness itself (a worker that cannot start); the caller
// decides what to do with the report.
func Run(tb testing.TB, target *Target, opt Options) *Report {
	tb.Helper()
	if opt.Workers < 4 {
		opt.Workers = 4
	}
	h := fnv.New64a()
	h.Write([]byte(target.Backend))
	c := &coordinator{
		tb: tb, target: target, opt: opt,
		rng:      rand.New(rand.NewPCG(opt.Seed, h.Sum64())),
		resource: StartResource(),
		holding:  make(map[int]int),
	}
	defer c.resource.Close()
	defer c.killAll() // when the run fails halfway; a no-op after stop

	c.hist.Start = now()
	c.hist.Semaphore, c.hist.Permits, c.hist.RW = semName, semPermits, rwName
	for i := range opt.Workers {
		c.spawn(i, 1)
	}
	c.inject(opt.Duration)
	c.stop()
	c.hist.End = now()
	c.hist.Writes = c.resource.Log()

	dir := artifactDir(tb)
	r := Check(&c.hist, dir)
	if dir != "" {
		r.HistoryFile = filepath.Join(dir, "history.json")
		if err := writeJSON(r.HistoryFile, &c.hist); err != nil {
			r.HistoryFile = ""
			tb.Logf("chaos: saving the history: %v", err)
		}
	}
	r.Backend, r.Seed, r.Duration = target.Backend, opt.Seed, time.Duration(c.hist.End-c.hist.Start)
	r.Workers = c.spawned
	r.Problems = append(r.Problems, c.problems...)
	return r
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// artifactDir returns tb's artifact directory when tb is a *testing.T or *testing.B.
func artifactDir(tb testing.TB) string {
	if a, ok := tb.(interface{ ArtifactDir() string }); ok {
		return a.ArtifactDir()
	}
	return ""
}

// coordinator runs the workers, injects the faults and records the history.
type coordinator struct {
	tb       testing.TB
	target   *Target
	opt      Options
	rng      *rand.Rand // only the test's goroutine uses it (it injects and spawns)
	resource *Resource

	mu      sync.Mutex // protects hist, workers, holding, granted and spawned
	hist    History
	workers []*workerProc // the current incarnation of each worker
	holding map[int]int   // worker → locks granted whose Done it has not seen yet
	granted int           // grants seen
	spawned int

	problems []string // harness failures; only the test's goroutine touches it
}

// workerProc is one worker process.
type workerProc struct {
	id, inc int
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	reaped  chan struct{} // closed once the process has exited and been reaped
	drained chan struct{} // closed once its stdout has been read to the end
	killed  bool          // by the coordinator: its exit status means nothing
	waitErr error         // read after reaped
	stderr  bytes.Buffer  // written by os/exec's goroutine until reaped
	other   []string      // stdout lines that are not events (test output, panics); read after drained
}

// spawn starts incarnation inc of worker id.
func (c *coordinator) spawn(id, inc int) {
	c.tb.Helper()
	cfg := WorkerConfig{
		Worker: id, Inc: inc, Seed: c.opt.Seed, Conn: c.target.Conn, Names: c.target.Names, Loops: c.opt.Loops,
		Resource:    c.resource.URL,
		WatchdogTTL: minLease + time.Duration(c.rng.Int64N(int64(300*time.Millisecond))),
		LeaseMin:    minLease, LeaseMax: maxLease,
		ReleaseOnLoss: id%2 == 1,
		Semaphore:     semName, Permits: semPermits, RW: rwName,
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		c.tb.Fatalf("chaos: worker config: %v", err)
	}
	// The worker is this test binary again: its TestMain calls WorkerMain, which finds cfg.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), WorkerEnv+"="+string(raw))
	w := &workerProc{id: id, inc: inc, cmd: cmd, reaped: make(chan struct{}), drained: make(chan struct{})}
	cmd.Stderr = &w.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.tb.Fatalf("chaos: worker %d: %v", id, err)
	}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		c.tb.Fatalf("chaos: worker %d: %v", id, err)
	}
	if err := cmd.Start(); err != nil {
		c.tb.Fatalf("chaos: start worker %d: %v", id, err)
	}
	go c.read(w, stdout)
	go func() {
		<-w.drained // Wait closes stdout: read it to the end first
		w.waitErr = cmd.Wait()
		close(w.reaped)
	}()
	c.mu.Lock()
	if id < len(c.workers) {
		c.workers[id] = w
	} else {
		c.workers = append(c.workers, w)
	}
	c.holding[id] = 0
	c.spawned++
	c.mu.Unlock()
}

// read collects a worker's events from its stdout until the process closes it.
func (c *coordinator) read(w *workerProc, stdout io.Reader) {
	defer close(w.drained)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e Event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Kind == "" {
			w.other = append(w.other, string(line))
			continue
		}
		c.mu.Lock()
		c.hist.Events = append(c.hist.Events, e)
		switch e.Kind {
		case EvGrant:
			c.holding[e.Worker]++
			if e.Prim == "" { // MinAcquisitions counts the mutex's grants
				c.granted++
			}
		case EvDone:
			c.holding[e.Worker] = max(c.holding[e.Worker]-1, 0)
		}
		c.mu.Unlock()
	}
}

// The kinds of fault, as reported.
const (
	FaultLatency     = "latency"          // both directions slowed for a while
	FaultDropReply   = "drop-reply"       // the reply to one lock request lost, its connection cut
	FaultDelayReply  = "delay-reply"      // the reply to one lock request held back
	FaultBlackhole   = "blackhole"        // a partition: every byte lost for a while
	FaultReset       = "reset"            // every connection reset
	FaultRefuse      = "refuse"           // connections reset and new ones refused for a while
	FaultServerPause = "server-pause"     // the server SIGSTOPped for a while
	FaultIsolate     = "member-partition" // one member cut off from its peers for a while
	FaultServerCrash = "server-crash"     // kill -9 and restart, data kept
	FaultDataLoss    = "server-crash-data-loss"
	FaultWorkerKill  = "worker-kill" // a worker SIGKILLed and started again
	FaultWorkerStop  = "worker-stop" // a worker SIGSTOPped past its lease, then SIGCONTed
	FaultSlowWrites  = "slow-writes" // the resource's network slow: writes arrive up to a lease late
)

// faultKinds returns the faults the target supports.
func (c *coordinator) faultKinds() []string {
	var kinds []string
	add := func(k string, ok bool) {
		if ok {
			kinds = append(kinds, k)
		}
	}
	t := c.target
	proxy := t.Proxy != nil
	add(FaultLatency, proxy)
	add(FaultDropReply, proxy && len(t.Requests) > 0)
	add(FaultDelayReply, proxy && len(t.Requests) > 0)
	add(FaultBlackhole, proxy)
	add(FaultReset, proxy)
	add(FaultRefuse, proxy)
	add(FaultServerPause, t.Pause != nil && t.Resume != nil)
	add(FaultIsolate, t.Isolate != nil && t.Rejoin != nil)
	add(FaultServerCrash, t.Crash != nil)
	add(FaultDataLoss, t.CrashLosingData != nil)
	add(FaultWorkerKill, true)
	add(FaultWorkerStop, true)
	add(FaultSlowWrites, true)
	return kinds
}

// inject injects faults, one at a time with a little calm between them, for d. Faults come in
// rounds: each round is every kind the target supports, once, in a random order, so that a
// run of a few rounds covers every kind. It runs on the test's goroutine: the testserver
// helpers it calls may fail the test.
func (c *coordinator) inject(d time.Duration) {
	kinds := c.faultKinds()
	var round []string
	end := time.Now().Add(d)
	if c.opt.NoFaults {
		c.sleep(d)
		return
	}
	deadline := time.Now().Add(max(c.opt.MaxDuration, d))
	injected := 0
	for time.Until(end) > 0 || (c.short(injected) && time.Until(deadline) > 0) {
		calm := c.between(100*time.Millisecond, 600*time.Millisecond)
		if time.Until(end) <= 0 && injected >= c.opt.MinFaults {
			calm *= 5 // past Duration with faults enough, waiting for grants: let them come
		}
		c.sleep(calm)
		injected++
		if len(round) == 0 {
			round = slices.Clone(kinds)
			c.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		}
		c.injectOne(round[0])
		round = round[1:]
	}
}

// short reports whether the run has not yet seen the grants and faults it asks for.
func (c *coordinator) short(injected int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.granted < c.opt.MinAcquisitions || injected < c.opt.MinFaults
}

// injectOne injects one fault of kind and takes it back.
func (c *coordinator) injectOne(kind string) {
	c.tb.Helper()
	t, p := c.target, c.target.Proxy
	from := now()
	detail := ""
	switch kind {
	case FaultLatency:
		up, down := c.between(20*time.Millisecond, 250*time.Millisecond), c.between(20*time.Millisecond, 250*time.Millisecond)
		p.SetLatency(up, down)
		c.sleep(c.between(300*time.Millisecond, 1500*time.Millisecond))
		p.SetLatency(0, 0)
		detail = fmt.Sprintf("to server %v, to client %v", up, down)
	case FaultDropReply, FaultDelayReply:
		match := t.Requests[c.rng.IntN(len(t.Requests))]
		var f *testserver.Fault
		var wait time.Duration
		if kind == FaultDropReply {
			f, wait = p.DropReply(match), 3*time.Second
		} else {
			delay := c.between(300*time.Millisecond, 1500*time.Millisecond)
			f, wait = p.DelayReply(match, delay), delay+3*time.Second
			detail = fmt.Sprintf("by %v", delay)
		}
		select {
		case <-f.Done():
		case <-time.After(wait):
			detail += " (armed, no matching request yet)"
		}
	case FaultBlackhole:
		p.Blackhole()
		c.sleep(c.between(200*time.Millisecond, 1500*time.Millisecond))
		p.Heal()
	case FaultReset:
		p.Reset()
	case FaultRefuse:
		p.Refuse()
		p.Reset()
		c.sleep(c.between(200*time.Millisecond, 800*time.Millisecond))
		p.Allow()
	case FaultServerPause:
		t.Pause(c.tb)
		c.sleep(c.between(200*time.Millisecond, 1200*time.Millisecond))
		t.Resume(c.tb)
	case FaultIsolate:
		t.Isolate(c.tb)
		c.sleep(c.between(500*time.Millisecond, 3*time.Second))
		t.Rejoin(c.tb)
	case FaultServerCrash:
		t.Crash(c.tb)
	case FaultDataLoss:
		names := t.CrashLosingData(c.tb)
		// The primitives' names may have lived on the crashed server too (on a cluster,
		// maybe not): taken as lost, which can only excuse more.
		names = append(names, semName, rwName)
		c.mu.Lock()
		c.hist.Wipes = append(c.hist.Wipes, Wipe{Names: names, From: from, To: now()})
		c.mu.Unlock()
		detail = "lost " + strings.Join(names, ", ")
	case FaultWorkerKill:
		detail = c.killWorker()
	case FaultWorkerStop:
		detail = c.stopWorker()
	case FaultSlowWrites:
		slow := c.between(minLease/2, maxLease)
		c.resource.SetSlow(slow)
		c.sleep(c.between(500*time.Millisecond, 2*time.Second))
		c.resource.SetSlow(0)
		detail = fmt.Sprintf("up to %v", slow)
	}
	c.mu.Lock()
	c.hist.Faults = append(c.hist.Faults, Fault{Kind: kind, From: from, To: now(), Detail: detail})
	c.mu.Unlock()
}

// pickWorker returns a worker that holds a lock, or any worker when none does.
func (c *coordinator) pickWorker() *workerProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	var holders []*workerProc
	for _, w := range c.workers {
		if c.holding[w.id] > 0 {
			holders = append(holders, w)
		}
	}
	if len(holders) > 0 && c.rng.IntN(4) > 0 {
		return holders[c.rng.IntN(len(holders))]
	}
	return c.workers[c.rng.IntN(len(c.workers))]
}

// killWorker kills a worker (SIGKILL: a crash, no release) and starts a new incarnation.
func (c *coordinator) killWorker() string {
	w := c.pickWorker()
	w.killed = true
	_ = w.cmd.Process.Kill()
	at := now()
	<-w.reaped
	c.mu.Lock()
	c.hist.Kills = append(c.hist.Kills, Kill{Worker: w.id, Inc: w.inc, At: at})
	c.mu.Unlock()
	c.sleep(c.between(0, 300*time.Millisecond))
	c.spawn(w.id, w.inc+1)
	return fmt.Sprintf("w%d.%d", w.id, w.inc)
}

// stopWorker stops a worker (SIGSTOP) for longer than any lease, then resumes it.
func (c *coordinator) stopWorker() string {
	w := c.pickWorker()
	pid := w.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Sprintf("w%d.%d: %v", w.id, w.inc, err)
	}
	_ = testserver.WaitStopped(pid) // a process /proc cannot see stops before it next runs
	from := now()
	c.sleep(maxLease + c.between(200*time.Millisecond, 800*time.Millisecond))
	to := now()
	_ = syscall.Kill(pid, syscall.SIGCONT)
	c.mu.Lock()
	c.hist.Stops = append(c.hist.Stops, Stop{Worker: w.id, Inc: w.inc, From: from, To: to})
	c.mu.Unlock()
	return fmt.Sprintf("w%d.%d for %v", w.id, w.inc, time.Duration(to-from).Round(time.Millisecond))
}

// stop tells every worker to stop (closes its stdin), waits for them to release and exit,
// and checks that they exited cleanly: a worker's race report, panic or leaked goroutine
// fails the run.
func (c *coordinator) stop() {
	c.mu.Lock()
	workers := slices.Clone(c.workers)
	c.mu.Unlock()
	for _, w := range workers {
		_ = w.stdin.Close()
	}
	deadline := time.Now().Add(stopTimeout) // for all of them: a second worker that hangs is timed out too
	for _, w := range workers {
		select {
		case <-w.reaped:
		case <-time.After(time.Until(deadline)):
			// The Go runtime prints every goroutine's stack on SIGQUIT, and exits: say where
			// the worker hung.
			_ = w.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-w.reaped:
			case <-time.After(5 * time.Second):
				_ = w.cmd.Process.Kill()
				<-w.reaped
			}
			w.killed = true
			dump := w.stderr.String()
			if len(dump) > 30000 {
				dump = dump[:30000] + "\n…"
			}
			c.problems = append(c.problems, fmt.Sprintf("worker w%d.%d did not stop within %v; its goroutines:\n%s",
				w.id, w.inc, stopTimeout, dump))
		}
	}
	for _, w := range workers {
		if w.killed {
			continue
		}
		if w.waitErr != nil {
			c.problems = append(c.problems, fmt.Sprintf("worker w%d.%d exited with %v:\n%s\n%s",
				w.id, w.inc, w.waitErr, strings.Join(w.other, "\n"), w.stderr.String()))
		}
	}
}

// killAll kills every worker still running.
func (c *coordinator) killAll() {
	c.mu.Lock()
	workers := slices.Clone(c.workers)
	c.mu.Unlock()
	for _, w := range workers {
		select {
		case <-w.reaped:
		default:
			w.killed = true
			_ = w.cmd.Process.Kill()
			<-w.reaped
		}
	}
}

// sleep paces the injection: the calm between faults and how long one lasts. Nothing waits
// on it for synchronisation.
func (c *coordinator) sleep(d time.Duration) { time.Sleep(d) }

// between returns a random duration in [lo, hi].
func (c *coordinator) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)+1))
}
