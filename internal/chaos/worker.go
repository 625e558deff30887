package chaos

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/mysqlstore"
	"github.com/guardlock/guard/pgstore"
	"github.com/guardlock/guard/redisstore"
)

// WorkerEnv names the environment variable that carries a worker's WorkerConfig, as JSON.
const WorkerEnv = "GUARD_CHAOS_WORKER"

// Conn tells a worker how to reach the backend.
type Conn struct {
	Kind  string   // "redis", "cluster", "mongo", "postgres", "mysql", or one RegisterKind added
	Addrs []string // redis: the server's address; cluster: seed addresses; etcd: the endpoints
	// Route maps a cluster node's address to the address to dial instead: the FaultProxy in
	// front of that node.
	Route    map[string]string `json:",omitempty"`
	URI      string            `json:",omitempty"` // mongo, postgres, mysql (a DSN)
	Database string            `json:",omitempty"` // mongo

	// Sabotage breaks the lock on purpose, to show that the checks catch it. "steal": an
	// acquisition that finds the name held force-releases it and takes it (the backend must
	// be an Inspector). "permits": the workers take permits of a semaphore of one more permit
	// than WorkerConfig.Permits, which the check expects.
	Sabotage string `json:",omitempty"`
}

// WorkerConfig is what one worker process is told.
type WorkerConfig struct {
	Worker, Inc int
	Seed        uint64 // with Worker and Inc, seeds the worker's choices
	Conn        Conn
	Names       []string // the lock names to contend on
	Resource    string   // the Resource's URL
	WatchdogTTL time.Duration
	// LeaseMin and LeaseMax bound the LeaseTime of the acquisitions that take one.
	LeaseMin, LeaseMax time.Duration
	// ReleaseOnLoss makes the worker's Observer release a lock as soon as it hears of its
	// loss, from within the Guard's event delivery (reasonable user code that once
	// deadlocked a Guard).
	ReleaseOnLoss bool
	// Loops is how many goroutines of the worker process contend, on its one Guard; at
	// least 1.
	Loops int
	// Semaphore names a semaphore of Permits permits and RW a read-write lock: primLoops more
	// goroutines take permits, read and write locks of them, on a backend that grants shared
	// holds. "": none.
	Semaphore string `json:",omitempty"`
	Permits   int    `json:",omitempty"`
	RW        string `json:",omitempty"`
}

// primLoops is how many goroutines of a worker process take permits and read-write locks, on
// top of its Loops: with four workers, four contenders, of which half the rounds take a
// permit — enough that a semaphore that let three in is caught within seconds
// (TestChaosCatchesABrokenSemaphore). Two per worker starved a three-member etcd cluster on a
// loaded two-core machine (its status calls timed out).
const primLoops = 1

// WorkerMain runs a worker process when the environment carries a WorkerConfig, and reports
// false at once otherwise. The worker writes its history to stdout and runs until its stdin
// is closed. Call it first thing in the TestMain of the test binary that calls Run: the
// workers are that binary, started again.
func WorkerMain() (ran bool, err error) {
	raw := os.Getenv(WorkerEnv)
	if raw == "" {
		return false, nil
	}
	var cfg WorkerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return true, fmt.Errorf("chaos: worker config: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdinDone := make(chan struct{})
	go func() {
		defer close(stdinDone)
		_, _ = io.Copy(io.Discard, os.Stdin) // the coordinator closes stdin to stop us
		cancel()
	}()
	err = RunWorker(ctx, cfg, os.Stdout)
	cancel()
	_ = os.Stdin.Close()
	<-stdinDone
	return true, err
}

// RunWorker contends for cfg.Names until ctx ends, writing one JSON Event per line to out.
// Each line is written with one Write call, so that a worker killed mid-run leaves whole
// lines behind.
func RunWorker(ctx context.Context, cfg WorkerConfig, out io.Writer) error {
	rec := &recorder{out: out, worker: cfg.Worker, inc: cfg.Inc}
	backend, closeClient, err := open(cfg.Conn)
	if err != nil {
		return err
	}
	defer func() {
		// A driver's Close can wait for good on a connection that died without a word:
		// pgxpool's Close waits for the health-check ping of a pooled connection that a
		// blackhole left reading forever (four workers hung so at the end of one run). The
		// process exits next: closing the client is a courtesy to the server, not a duty.
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			closeClient()
		}()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
		}
	}()
	g := guard.New(backend,
		guard.WithWatchdogTimeout(cfg.WatchdogTTL),
		guard.WithObserver(rec),
		guard.WithInstance(fmt.Sprintf("chaos-w%d.%d", cfg.Worker, cfg.Inc)))
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Close(cctx)
	}()
	rec.releaseOnLoss = cfg.ReleaseOnLoss
	client := &http.Client{Timeout: writeTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	prims, err := openPrimitives(g, cfg)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	loops := max(cfg.Loops, 1)
	for loop := range loops + primLoops {
		if loop >= loops && prims == nil {
			break
		}
		w := &worker{
			cfg: cfg, g: g, rec: rec, http: client,
			rng: rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Worker)<<32|uint64(cfg.Inc)<<8|uint64(loop))),
		}
		wg.Go(func() {
			for seq := 1; ctx.Err() == nil; seq++ {
				call := fmt.Sprintf("w%d.%d.%d.%d", cfg.Worker, cfg.Inc, loop, seq)
				if loop < loops {
					w.round(ctx, call)
				} else {
					w.primRound(ctx, call, prims)
				}
			}
		})
	}
	wg.Wait()
	rec.emit(Event{Kind: EvExit, At: now()})
	return nil
}

// writeTimeout is how long a worker waits for the answer to a fenced write. It gives up sooner
// than a slow network delivers (FaultSlowWrites): the write then arrives at the resource
// after the worker has moved on — released its lock, even — as a late write does in life.
const writeTimeout = 400 * time.Millisecond

// open returns a Store on the backend c names, and a function that closes its client.
func open(c Conn) (guard.Backend, func(), error) {
	b, closeClient, err := openStore(c)
	if err != nil || c.Sabotage == "" || c.Sabotage == "permits" {
		return b, closeClient, err
	}
	ins, ok := b.(guard.Inspector)
	if c.Sabotage != "steal" || !ok {
		closeClient()
		return nil, nil, fmt.Errorf("chaos: cannot sabotage %s with %q", c.Kind, c.Sabotage)
	}
	return thief{Backend: b, ins: ins}, closeClient, nil
}

// thief is a broken backend: when a name is held, it takes it anyway. The holder keeps
// trusting its lock until its next renewal — to the end of its lease, for a LeaseTime lock.
type thief struct {
	guard.Backend
	ins guard.Inspector
}

func (t thief) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	fence, err := t.Backend.Acquire(ctx, r)
	if !errors.Is(err, guard.ErrNotAcquired) {
		return fence, err
	}
	_ = t.ins.ForceRelease(ctx, r.Name, 0)
	return t.Backend.Acquire(ctx, r)
}

func openStore(c Conn) (guard.Backend, func(), error) {
	switch c.Kind {
	case "redis":
		client := redis.NewClient(&redis.Options{
			Addr: c.Addrs[0], ContextTimeoutEnabled: true, // as docs/operations.md recommends
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		})
		return redisstore.New(client), func() { _ = client.Close() }, nil
	case "cluster":
		var d net.Dialer
		client := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: c.Addrs, ContextTimeoutEnabled: true,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if to, ok := c.Route[addr]; ok {
					addr = to
				}
				return d.DialContext(ctx, network, addr)
			},
		})
		return redisstore.New(client), func() { _ = client.Close() }, nil
	case "mongo":
		client, err := mongo.Connect(options.Client().ApplyURI(c.URI).
			SetServerSelectionTimeout(2 * time.Second).SetConnectTimeout(time.Second).
			SetTimeout(2 * time.Second).SetHeartbeatInterval(500 * time.Millisecond))
		if err != nil {
			return nil, nil, err
		}
		closeClient := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = client.Disconnect(ctx)
		}
		return mongostore.New(client.Database(c.Database).Collection("locks")), closeClient, nil
	case "postgres":
		cfg, err := pgxpool.ParseConfig(c.URI)
		if err != nil {
			return nil, nil, err
		}
		cfg.ConnConfig.ConnectTimeout = time.Second
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			return nil, nil, err
		}
		return pgstore.New(pool), pool.Close, nil
	case "mysql":
		cfg, err := mysql.ParseDSN(c.URI)
		if err != nil {
			return nil, nil, err
		}
		cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
		connector, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, nil, err
		}
		db := sql.OpenDB(connector)
		return mysqlstore.New(db), func() { _ = db.Close() }, nil
	}
	if open := kinds[c.Kind]; open != nil {
		return open(c)
	}
	return nil, nil, fmt.Errorf("chaos: unknown backend kind %q", c.Kind)
}

// kinds are the backend kinds that modules of their own add (RegisterKind).
var kinds = map[string]func(Conn) (guard.Backend, func(), error){}

// RegisterKind makes workers open a Conn of kind with open, which returns a store and a
// function that closes what it opened: a backend in a module of its own (etcdstore) runs the
// chaos from its own tests, whose binary is its workers. Call it in TestMain, before
// WorkerMain; a kind registered twice, or one of this package, panics.
func RegisterKind(kind string, open func(Conn) (guard.Backend, func(), error)) {
	switch kind {
	case "redis", "cluster", "mongo", "postgres", "mysql":
		panic("chaos: RegisterKind: " + kind + " is built in")
	}
	if kinds[kind] != nil {
		panic("chaos: RegisterKind: " + kind + " registered twice")
	}
	kinds[kind] = open
}

// worker is the state of one worker process's loop.
type worker struct {
	cfg  WorkerConfig
	g    *guard.Guard
	rec  *recorder
	rng  *rand.Rand
	http *http.Client
	seq  int // the number of the last write sent under the lock held now
}

// round makes one acquisition attempt and, when it is granted, holds the lock for a while
// with fenced writes and gives it back — or lets it lapse.
func (w *worker) round(ctx context.Context, call string) {
	name := w.cfg.Names[w.rng.IntN(len(w.cfg.Names))]
	mode, ttl := ModeWatchdog, w.cfg.WatchdogTTL
	var opts []guard.LockOption
	if w.rng.IntN(2) == 0 {
		mode, ttl = ModeLease, w.between(w.cfg.LeaseMin, w.cfg.LeaseMax)
		opts = append(opts, guard.LeaseTime(ttl))
	}
	try := w.rng.IntN(10) < 3
	if !try {
		opts = append(opts, guard.WaitTime(w.between(200*time.Millisecond, 3*time.Second)))
	}
	plan := w.rng.IntN(100)
	if w.rng.IntN(100) < 99 {
		plan = -1 // most jobs are quick: one write and a release, as a locked request's are
	}

	w.rec.emit(Event{Kind: EvStart, At: now(), Call: call, Name: name, Mode: mode, TTL: int64(ttl), Try: try})
	var l *guard.Lock
	var err error
	// The lock's context derives from the acquire's: ctx, which ends only when the worker stops.
	if try {
		l, err = w.g.TryAcquire(ctx, name, opts...)
	} else {
		l, err = w.g.Acquire(ctx, name, opts...)
	}
	if err != nil {
		w.rec.emit(Event{Kind: EvFail, At: now(), Call: call, Outcome: failure(err), Err: err.Error()})
		w.pause(ctx, w.between(5*time.Millisecond, 50*time.Millisecond))
		return
	}
	w.rec.emit(Event{
		Kind: EvGrant, At: l.AcquiredAt().UnixNano(), Call: call, Token: l.Token(), Name: name,
		Fence: l.Fence(), Deadline: l.Deadline().UnixNano(),
	})
	w.seq = 0
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		<-l.Done()
		w.rec.emit(Event{Kind: EvDone, At: now(), Token: l.Token(), Err: errString(l.Err())})
	}()

	release := true
	switch {
	case plan < 0: // a quick job
		w.write(l)
	case plan < 80: // a short job: a few writes
		w.writes(l, 1+w.rng.IntN(4))
	case plan < 90: // a long job, maybe longer than a lease: write until done or the lock ends
		w.writeFor(l, time.Duration(float64(ttl)*(0.5+2*w.rng.Float64())))
	case plan < 95 && mode == ModeLease: // a job that extends its lease, sometimes twice at once
		w.writes(l, 1+w.rng.IntN(2))
		w.extend(l, ttl, w.rng.IntN(2) == 0)
		w.writeFor(l, time.Duration(float64(ttl)*w.rng.Float64()))
	case mode == ModeLease: // a holder that never releases: its lease lapses
		w.writes(l, 1+w.rng.IntN(2))
		<-l.Done()
		release = false
	default: // a watchdog lock held a little longer, through a few renewals
		w.writeFor(l, time.Duration(float64(ttl)*w.rng.Float64()))
	}
	if release {
		// Half the time with the lock's own context, as `defer l.Release(ctx)` in a handler
		// does: often cancelled by then, and the release must still reach the backend.
		rctx := context.Background()
		if w.rng.IntN(2) == 0 {
			rctx = l.Context()
		}
		w.rec.release(l, rctx)
	}
	<-ended
	w.pause(ctx, w.between(0, 10*time.Millisecond))
}

// primitives are the semaphore and the read-write lock a worker's primLoops contend for.
type primitives struct {
	sem *guard.Semaphore
	rw  *guard.RWMutex
}

// openPrimitives returns cfg's primitives on g, or nil when cfg names none or the backend
// grants no shared holds.
func openPrimitives(g *guard.Guard, cfg WorkerConfig) (*primitives, error) {
	if cfg.Semaphore == "" || cfg.RW == "" {
		return nil, nil
	}
	permits := cfg.Permits
	if cfg.Conn.Sabotage == "permits" {
		permits++
	}
	sem, err := g.Semaphore(cfg.Semaphore, permits)
	if errors.Is(err, guard.ErrUnsupported) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rw, err := g.RWMutex(cfg.RW)
	if err != nil {
		return nil, err
	}
	return &primitives{sem: sem, rw: rw}, nil
}

// primRound takes a permit of the semaphore, or a side of the read-write lock, holds it
// briefly and gives it back — or lets its lease lapse. A writer sends fenced writes to the
// Resource, as a mutex holder does; readers and permit holders, who hold the name together,
// send none: the Resource's fence order is a single writer's.
func (w *worker) primRound(ctx context.Context, call string, p *primitives) {
	prim, name := PrimPermit, p.sem.Name()
	switch n := w.rng.IntN(10); {
	case n < 3:
		prim, name = PrimRead, p.rw.Name()
	case n < 5:
		prim, name = PrimWrite, p.rw.Name()
	}
	mode, ttl := ModeWatchdog, w.cfg.WatchdogTTL
	opts := []guard.LockOption{guard.WaitTime(w.between(200*time.Millisecond, 3*time.Second))}
	if w.rng.IntN(2) == 0 {
		mode, ttl = ModeLease, w.between(w.cfg.LeaseMin, w.cfg.LeaseMax)
		opts = append(opts, guard.LeaseTime(ttl))
	}
	lapse := mode == ModeLease && w.rng.IntN(100) < 3
	w.rec.emit(Event{Kind: EvStart, At: now(), Call: call, Name: name, Prim: prim, Mode: mode, TTL: int64(ttl)})
	var l *guard.Lock
	var err error
	switch prim {
	case PrimPermit:
		l, err = p.sem.Acquire(ctx, opts...)
	case PrimRead:
		l, err = p.rw.RLock(ctx, opts...)
	default:
		l, err = p.rw.Lock(ctx, opts...)
	}
	if err != nil {
		w.rec.emit(Event{Kind: EvFail, At: now(), Call: call, Outcome: failure(err), Err: err.Error()})
		w.pause(ctx, w.between(5*time.Millisecond, 50*time.Millisecond))
		return
	}
	w.rec.emit(Event{
		Kind: EvGrant, At: l.AcquiredAt().UnixNano(), Call: call, Token: l.Token(), Name: name, Prim: prim,
		Fence: l.Fence(), Deadline: l.Deadline().UnixNano(),
	})
	w.seq = 0
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		<-l.Done()
		w.rec.emit(Event{Kind: EvDone, At: now(), Token: l.Token(), Err: errString(l.Err())})
	}()
	if prim == PrimWrite {
		w.writes(l, 1+w.rng.IntN(3))
	} else {
		w.pause(l.Context(), w.between(10*time.Millisecond, 150*time.Millisecond))
	}
	if lapse {
		<-l.Done()
	} else {
		w.rec.release(l, context.Background())
	}
	<-ended
	w.pause(ctx, w.between(0, 10*time.Millisecond))
}

// extend extends l's lease to ttl — and, when twice is set, at the same time to the shortest
// lease: two Extend calls in flight at once, answered in either order. The new deadlines come
// through the observer.
func (w *worker) extend(l *guard.Lock, ttl time.Duration, twice bool) {
	if l.Err() != nil {
		return
	}
	w.rec.emit(Event{Kind: EvExtend, At: now(), Token: l.Token()})
	if !twice {
		_ = l.Extend(context.Background(), ttl)
		return
	}
	var wg sync.WaitGroup
	for _, d := range []time.Duration{ttl + w.between(0, w.cfg.LeaseMin), w.cfg.LeaseMin} {
		wg.Go(func() { _ = l.Extend(context.Background(), d) })
	}
	wg.Wait()
}

// writes sends n fenced writes, a little apart, while the lock's context lives; the first one
// at once.
func (w *worker) writes(l *guard.Lock, n int) {
	for i := 1; i <= n; i++ {
		if i > 1 && !w.pause(l.Context(), w.between(10*time.Millisecond, 120*time.Millisecond)) {
			return
		}
		if !w.write(l) {
			return
		}
	}
}

// writeFor sends fenced writes every 50–150 ms for d, while the lock's context lives.
func (w *worker) writeFor(l *guard.Lock, d time.Duration) {
	end := time.Now().Add(d)
	for {
		if !w.write(l) {
			return
		}
		left := time.Until(end)
		if left <= 0 || !w.pause(l.Context(), min(left, w.between(50*time.Millisecond, 150*time.Millisecond))) {
			return
		}
	}
}

// write sends the next fenced write of l, if l's context lives — as the protected work
// would — and reports whether the context still lived. A lock's writes are numbered from 1
// across all its jobs' steps: the check matches each one with the resource's log by token
// and number.
func (w *worker) write(l *guard.Lock) bool {
	if l.Context().Err() != nil {
		return false
	}
	w.seq++
	seq := w.seq
	w.rec.emit(Event{Kind: EvWrite, At: now(), Token: l.Token(), Seq: seq, Fence: l.Fence()})
	q := url.Values{
		"name": {l.Name()}, "fence": {strconv.FormatUint(l.Fence(), 10)},
		"token": {l.Token()}, "seq": {strconv.Itoa(seq)},
	}
	outcome, msg := "error", ""
	resp, err := w.http.Post(w.cfg.Resource+"/write?"+q.Encode(), "text/plain", nil)
	if err != nil {
		msg = err.Error()
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			outcome = "accepted"
		case http.StatusConflict:
			outcome = "rejected"
		default:
			msg = resp.Status
		}
	}
	w.rec.emit(Event{Kind: EvWrote, At: now(), Token: l.Token(), Seq: seq, Outcome: outcome, Err: msg})
	return true
}

// pause waits d, or until ctx ends; it reports whether ctx still lives. (A worker's pauses
// are its think time, not synchronisation.)
func (w *worker) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// between returns a random duration in [lo, hi].
func (w *worker) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

// failure classifies an acquire error.
func failure(err error) string {
	var busy *guard.BusyError
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &busy) && busy.Waited > 0:
		return "timeout"
	case errors.Is(err, guard.ErrNotAcquired):
		return "busy"
	}
	return "error"
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func now() int64 { return time.Now().UnixNano() }

// recorder writes a worker's events, and is the Guard's Observer: it reports each new
// deadline (renewals, extensions) and the moment the Guard ended a lock's context.
type recorder struct {
	worker, inc   int
	releaseOnLoss bool
	mu            sync.Mutex // protects out: one line per Write
	out           io.Writer
}

// release releases l with ctx and records the call and its outcome.
func (r *recorder) release(l *guard.Lock, ctx context.Context) {
	r.emit(Event{Kind: EvRelease, At: now(), Token: l.Token()})
	err := l.Release(ctx)
	r.emit(Event{Kind: EvReleased, At: now(), Token: l.Token(), Err: errString(err)})
}

func (r *recorder) emit(e Event) {
	e.Worker, e.Inc = r.worker, r.inc
	b, err := json.Marshal(e)
	if err != nil {
		panic(err) // an Event always marshals
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.out.Write(b)
}

// AcquireStart implements guard.Observer.
func (r *recorder) AcquireStart(ctx context.Context, _ *guard.Acquisition) context.Context {
	return ctx
}

// AcquireEnd implements guard.Observer.
func (r *recorder) AcquireEnd(ctx context.Context, _ *guard.Acquisition, _ *guard.Lock, _ error) context.Context {
	return ctx
}

// LockEvent implements guard.Observer. The event's At is when the Guard queued it: for a loss
// or a lease end, just before it cancelled the lock's context.
func (r *recorder) LockEvent(l *guard.Lock, e guard.LockEvent) {
	switch e.Kind {
	case guard.EventRenewed, guard.EventExtended:
		r.emit(Event{Kind: EvDeadline, At: e.At.UnixNano(), Token: l.Token(), Deadline: e.Deadline.UnixNano()})
	case guard.EventLost, guard.EventLeaseExpired:
		r.emit(Event{Kind: EvLost, At: e.At.UnixNano(), Token: l.Token(), Err: errString(e.Err)})
		if r.releaseOnLoss {
			r.release(l, context.Background())
		}
	}
}
