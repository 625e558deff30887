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
// only the instance that leads runs the scheduler's jobs. Leading is holding one lock, taken
// without a lease time, so that the Guard's watchdog holds it for as long as the instance
// lives. Every Elector on the name campaigns from NewElector on: it waits for the lock, leads
// while it holds it, and waits again when it loses it.
//
// When the leader's Elector or Guard is closed, the lock is released and a waiting instance
// takes it at once (on Redis and memstore, release notifications wake it; on MongoDB, waiters
// re-try at most a second apart). When the leader's process dies, its lease runs out within
// one watchdog timeout and a waiting instance takes it then — on MongoDB, whose busy answer
// does not say when the lease ends, at the waiter's next re-try, up to a second later. Two
// instances never hold the lock with live contexts at once: the old leader's context ends, at
// the latest, at its validity deadline, which comes before its lease ends on the backend.
//
// A new leader waits out a settling time (Settle, DefaultSettle by default) before it leads,
// so that it does not run again a tick that the old leader ran just before it lost the lead
// and whose timer fires a little later on the new leader.
//
// An Elector is safe for concurrent use. Close it, before its Guard, to stop campaigning.
type Elector struct {
	g         *guard.Guard
	name      string
	settle    time.Duration
	onElected func(*guard.Lock)

	stop     context.CancelCauseFunc // ends the campaign
	done     chan struct{}           // closed when the campaign has ended
	closeErr error                   // the campaign's last release error; read after done

	mu   sync.Mutex // protects term
	term *term      // nil while another instance leads
}

var _ gocron.Elector = (*Elector)(nil)

// term is one hold of the leadership lock.
type term struct {
	lock    *guard.Lock
	elected time.Time // when the lock was taken; the instance leads from elected + settle
}

// ElectorOption configures an Elector. Pass options to NewElector, which checks them.
type ElectorOption func(*electorSettings)

// electorSettings is what ElectorOptions set.
type electorSettings struct {
	settle    time.Duration
	onElected func(*guard.Lock)
	err       error // the first invalid option
}

// Settle sets how long a newly elected instance waits before it leads: IsLeader reports
// ErrNotLeader until d has passed since it took the lock. Make d at least the spread of the
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

func (s *electorSettings) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// NewElector returns an Elector that campaigns for the lock called name on g, and starts its
// campaign. Every instance of a service must use the same name. It returns an error for a nil
// g, a *guard.NameError for a bad name, and a *guard.OptionError for an invalid option.
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
	ctx, stop := context.WithCancelCause(context.Background())
	e := &Elector{g: g, name: name, settle: s.settle, onElected: s.onElected, stop: stop, done: make(chan struct{})}
	go e.campaign(ctx)
	return e, nil
}

// Backoff after a backend failure: from firstBackoff, doubling up to maxBackoff, jittered.
const (
	firstBackoff = 10 * time.Millisecond
	maxBackoff   = time.Second
)

// campaign takes the leadership lock whenever it is free, and holds it until it is lost or
// ctx ends. It returns when ctx ends or the Guard is closed.
func (e *Elector) campaign(ctx context.Context) {
	defer close(e.done)
	backoff := firstBackoff
	for {
		l, err := e.g.Acquire(ctx, e.name)
		switch {
		case err == nil:
			backoff = firstBackoff
		case ctx.Err() != nil || errors.Is(err, guard.ErrClosed):
			return
		default:
			// The backend failed (the Guard's observer records it): try again later.
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
		e.term = &term{lock: l, elected: time.Now()}
		e.mu.Unlock()
		if e.onElected != nil {
			e.onElected(l)
		}
		<-l.Done() // lost, released by Guard.Close, or ctx ended (l's context derives from it)
		e.mu.Lock()
		e.term = nil
		e.mu.Unlock()
		// Give the name back at once if it is still ours, so that the next leader need not
		// wait for the lease to run out. A lock that was lost, or released by Guard.Close,
		// has nothing to give back; a failure matters only when Close asked for the release.
		err = l.Release(context.Background())
		if ctx.Err() != nil {
			if !errors.Is(err, guard.ErrNotHeld) {
				e.closeErr = err
			}
			return
		}
	}
}

// IsLeader returns nil when this instance leads: it holds the leadership lock, its lock's
// context is live, and the settling time has passed since it took it. Otherwise it returns an
// error matching ErrNotLeader, or ctx's error when ctx is done. gocron calls it before every
// run, with the job's context, and skips the run on an error.
func (e *Elector) IsLeader(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
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
	if since := time.Since(t.elected); since < e.settle {
		return nil, fmt.Errorf("%w yet: elected %v ago, settling for %v", ErrNotLeader, since.Round(time.Millisecond), e.settle)
	}
	return t, nil
}

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
