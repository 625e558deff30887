package gocronlock

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/guardlock/guard"
)

// Elector is a gocron.Elector on a guard.Guard: pass it to gocron.WithDistributedElector, and
// only the instance that leads runs the scheduler's jobs. It campaigns in a guard.Election of
// the name (Election): leading is holding one of its terms, a lock taken without a lease time,
// so that the Guard's watchdog holds it for as long as the instance lives. Every Elector on the
// name campaigns from NewElector on: it waits for a term, leads while it holds it, and waits
// again when it loses it. Any instance — an Elector's or a plain guard.Election's — can read
// who leads and what the leader published (LeaderValue), and watch the terms change.
//
// When the leader's Elector or Guard is closed, the lock is released and a waiting instance
// takes it at once (on Redis and memstore, release notifications wake it; on MongoDB, waiters
// re-try at most a second apart). When the leader's process dies, its lease runs out within
// one watchdog timeout and a waiting instance takes it then — on MongoDB, whose busy answer
// does not say when the lease ends, at the waiter's next re-try, up to a second later. Two
// instances never hold the lock with live contexts at once: the old leader's context ends, at
// the latest, at its validity deadline, which comes before its lease ends on the backend.
//
// An Elector answers from the first tick. Its campaign opens with one attempt to take the
// lock, and IsLeader waits for that attempt's outcome (up to FirstElectionWait) before it first
// answers, so that a job gocron runs right after the scheduler starts — a one-time job started
// immediately — runs on the instance that took the lock, and only there.
//
// That first answer is no on every instance while the name is held: by a live leader, or by
// the lease of a leader that died without releasing it, until that lease runs out (within one
// watchdog timeout of the death). gocron asks once per run and skips the run on a no, so a
// one-time job started immediately then runs nowhere, and a periodic job first runs at the
// first tick after an instance has taken over and settled. An Elector cannot tell a dead
// leader's lease from a live one's; a first answer that waited out every held lease would hold
// each instance's first runs for up to a watchdog timeout at every start, only to answer no
// while a live leader leads. Work that must run whenever an instance begins to lead goes in
// OnElected (started on a goroutine of its own when it takes long), which runs as soon as the
// stale lease has run out. A leader that closes its Elector on shutdown releases the name and
// leaves no lease behind.
//
// A leader that took over from another one — it waited for the lock, which the old leader
// released, lost or let run out — waits out a settling time (Settle, DefaultSettle by
// default) before it leads, so that it does not run again a tick that the old leader ran just
// before it lost the lead and whose timer fires a little later on the new leader. An instance
// whose first attempt found the name free took it from nobody, and leads at once.
//
// An Elector is safe for concurrent use. Close it, before its Guard, to stop campaigning.
type Elector struct {
	election  *guard.Election
	value     string // published with each term
	settle    time.Duration
	onElected func(*guard.Lock)

	stop     context.CancelCauseFunc // ends the campaign
	done     chan struct{}           // closed when the campaign has ended
	closeErr error                   // the campaign's last release error; read after done

	decided    chan struct{} // closed once the campaign's first attempt has an outcome
	decideOnce sync.Once

	mu   sync.Mutex // protects term
	term *term      // nil while another instance leads
}

var _ gocron.Elector = (*Elector)(nil)

// term is one hold of the leadership lock.
type term struct {
	lock    *guard.Lock
	elected time.Time // when the lock was taken; the instance leads from elected + settle
	settled bool      // taken from nobody, at the campaign's first attempt: it leads at once
}

// FirstElectionWait bounds how long IsLeader waits for the outcome of an Elector's first
// attempt to take the lock: a backend that does not answer by then makes it answer
// ErrNotLeader, and the campaign goes on.
const FirstElectionWait = 5 * time.Second

// ElectorOption configures an Elector. Pass options to NewElector, which checks them.
type ElectorOption func(*electorSettings)

// electorSettings is what ElectorOptions set.
type electorSettings struct {
	settle    time.Duration
	value     string
	onElected func(*guard.Lock)
	err       error // the first invalid option
}

// Settle sets how long an instance that took over the lead from another waits before it leads:
// IsLeader reports ErrNotLeader until d has passed since it took the lock. (An instance whose
// first attempt found the name free leads at once.) Make d at least the spread of the
// instances' timers and clocks, as for guard.MinHold (docs/scheduling.md); a hand-over then
// costs at most the ticks within d, and never runs a tick twice. Default: DefaultSettle. d must
// not be negative.
func Settle(d time.Duration) ElectorOption {
	return func(s *electorSettings) {
		if d < 0 {
			s.fail(&guard.OptionError{Option: "Settle", Value: d, Reason: "must not be negative"})
			return
		}
		s.settle = d
	}
}

// OnElected calls fn with the leadership lock each time this instance takes it, before it
// leads; the lock's Context ends when the term does, and its Fence numbers the term. fn runs
// on the campaign's goroutine: it must return promptly. Default: none.
func OnElected(fn func(*guard.Lock)) ElectorOption {
	return func(s *electorSettings) { s.onElected = fn }
}

// LeaderValue sets what this instance publishes while it leads — its address, say — which
// guard.Election.Leader reads on every instance (see Election). Default: "".
func LeaderValue(v string) ElectorOption {
	return func(s *electorSettings) { s.value = v }
}

func (s *electorSettings) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// NewElector returns an Elector that campaigns in the election called name on g
// (guard.NewElection), and starts its campaign. Every instance of a service must use the same
// name. It returns an error for a nil g, a *guard.NameError for a bad name, a
// *guard.OptionError for an invalid option, and an error matching guard.ErrUnsupported when
// g's backend cannot tell who holds a lock (it does not implement guard.Inspector; every
// backend of this module does).
func NewElector(g *guard.Guard, name string, opts ...ElectorOption) (*Elector, error) {
	if g == nil {
		return nil, errors.New("guard/gocronlock: NewElector with a nil *guard.Guard")
	}
	if err := guard.CheckName(name); err != nil {
		return nil, err
	}
	s := electorSettings{settle: DefaultSettle}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	election, err := guard.NewElection(g, name)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancelCause(context.Background())
	e := &Elector{election: election, value: s.value, settle: s.settle, onElected: s.onElected, stop: stop,
		done: make(chan struct{}), decided: make(chan struct{})}
	go e.campaign(ctx)
	return e, nil
}

// Backoff after a backend failure: from firstBackoff, doubling up to maxBackoff, jittered.
const (
	firstBackoff = 10 * time.Millisecond
	maxBackoff   = time.Second
)

// campaign takes a term of the election whenever nobody leads, and holds it until it is lost
// or ctx ends. It returns when ctx ends or the Guard is closed. Its first attempt is a single
// one, whose outcome it tells IsLeader (decide); later ones wait for the term.
func (e *Elector) campaign(ctx context.Context) {
	defer close(e.done)
	defer e.decide() // a campaign that ends undecided leaves nobody waiting
	backoff := firstBackoff
	for first := true; ; first = false {
		var l *guard.Lock
		var err error
		if first {
			l, err = e.election.Campaign(ctx, e.value, guard.WaitTime(0))
			if errors.Is(err, guard.ErrNotAcquired) && ctx.Err() == nil {
				e.decide() // another instance leads
				l, err = e.election.Campaign(ctx, e.value)
				first = false
			}
		} else {
			l, err = e.election.Campaign(ctx, e.value)
		}
		switch {
		case err == nil:
			backoff = firstBackoff
		case ctx.Err() != nil || errors.Is(err, guard.ErrClosed):
			return
		default:
			// The backend failed (the Guard's observer records it): try again later.
			e.decide()
			d := backoff/2 + mrand.N(backoff/2+1)
			backoff = min(2*backoff, maxBackoff)
			t := time.NewTimer(d)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return
			}
		}

		e.mu.Lock()
		e.term = &term{lock: l, elected: time.Now(), settled: first}
		e.mu.Unlock()
		if e.onElected != nil {
			e.onElected(l)
		}
		e.decide()
		<-l.Done() // lost, released by Guard.Close, or ctx ended (l's context derives from it)
		e.mu.Lock()
		e.term = nil
		e.mu.Unlock()
		// Give the term back at once if it is still ours, so that the next leader need not
		// wait for the lease to run out. A term that was lost, or released by Guard.Close,
		// has nothing to give back; a failure matters only when Close asked for the release.
		// (Election.Resign would not do: the election forgets a term as soon as its context
		// ends, and a lost term stays reported by Election.Check until the next one begins.)
		err = l.Release(context.Background())
		if ctx.Err() != nil {
			if !errors.Is(err, guard.ErrNotHeld) {
				e.closeErr = err
			}
			return
		}
	}
}

// decide tells IsLeader that the first election has an outcome.
func (e *Elector) decide() { e.decideOnce.Do(func() { close(e.decided) }) }

// awaitFirstElection waits until the campaign's first attempt has an outcome, ctx ends (its
// error), or FirstElectionWait has passed.
func (e *Elector) awaitFirstElection(ctx context.Context) error {
	select {
	case <-e.decided:
		return nil
	default:
	}
	t := time.NewTimer(FirstElectionWait)
	defer t.Stop()
	select {
	case <-e.decided:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// IsLeader returns nil when this instance leads: it holds the leadership lock, its lock's
// context is live, and it took the lock from nobody or the settling time has passed since it
// took it. Otherwise it returns an error matching ErrNotLeader, or ctx's error when ctx is
// done. Until the campaign's first attempt has an outcome, IsLeader waits for it, up to
// FirstElectionWait. gocron calls it before every run, with the job's context, and skips the
// run on an error.
func (e *Elector) IsLeader(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := e.awaitFirstElection(ctx); err != nil {
		return err
	}
	_, err := e.leading()
	return err
}

// leading returns the current term when this instance leads, else an error matching
// ErrNotLeader.
func (e *Elector) leading() (*term, error) {
	e.mu.Lock()
	t := e.term
	e.mu.Unlock()
	if t == nil || t.lock.Err() != nil {
		return nil, ErrNotLeader
	}
	if since := time.Since(t.elected); !t.settled && since < e.settle {
		return nil, fmt.Errorf("%w yet: elected %v ago, settling for %v", ErrNotLeader, since.Round(time.Millisecond), e.settle)
	}
	return t, nil
}

// Election returns the election the Elector campaigns in: its Leader says who leads and what
// it published (LeaderValue) wherever it runs, Observe reports each new term in order, and
// Check is a liveness probe's: an error while this instance leads with a term it fails to
// renew, and after it lost one until it leads again. Campaigning and resigning are the
// Elector's: call neither Campaign nor Resign on it.
func (e *Elector) Election() *guard.Election { return e.election }

// Leader returns the leadership lock and true while this instance holds it with a live
// context — also while it is still settling. The lock's Context ends when the term does; its
// Fence numbers the term.
func (e *Elector) Leader() (*guard.Lock, bool) {
	e.mu.Lock()
	t := e.term
	e.mu.Unlock()
	if t == nil || t.lock.Err() != nil {
		return nil, false
	}
	return t.lock, true
}

// Func returns task wrapped so that it runs only while this instance leads, under a context
// that also ends when the leadership does: give it to gocron.NewTask, with no context among the
// task's parameters. The wrapped task calls task with the job's context, cancelled — with the
// cause guard.ErrLockLost, guard.ErrClosed or ErrClosed — when the term ends. It returns
// task's error, joined with the cause when the leadership lock was lost while task ran; or an
// error matching ErrNotLeader, without calling task, when this instance does not lead. Func
// panics when task is nil.
//
// The context keeps the job context's values; guard.FromContext does not find the leadership
// lock in it (Leader does).
func (e *Elector) Func(task func(context.Context) error) func(context.Context) error {
	if task == nil {
		panic("guard/gocronlock: Elector.Func(nil)")
	}
	return func(ctx context.Context) error {
		if err := e.awaitFirstElection(ctx); err != nil {
			return err
		}
		t, err := e.leading()
		if err != nil {
			return err
		}
		lctx := t.lock.Context()
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) })
		defer stop()
		err = task(ctx)
		if cause := lossCause(lctx); cause != nil && !errors.Is(err, cause) {
			err = errors.Join(err, cause)
		}
		return err
	}
}

// Close stops the campaign: when this instance leads, its term ends (the leadership lock's
// context ends with cause ErrClosed) and the lock is released, so that another instance takes
// over at once. It waits for the campaign's goroutine, or for ctx. It returns the release's
// backend error, if any, or ctx's error when ctx ended the wait. Close is idempotent.
func (e *Elector) Close(ctx context.Context) error {
	e.stop(ErrClosed)
	select {
	case <-e.done:
		return e.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}
