package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Election elects one leader among the instances that campaign for a name, as etcd's
// concurrency.Election and client-go's leader election do, with a Lock's guarantees: a term is
// a Lock — its own fence, higher for every new term; a context that ends before its lease can
// run out when leadership is lost; renewed by the watchdog, or held for a LeaseTime — and the
// leader publishes a value (its address, say) that everyone can read.
type Election struct {
	g    *Guard
	name string
	insp Inspector

	mu   sync.Mutex // protects term and lost
	term *Lock      // this instance's term while it leads
	lost error      // why its last term ended, when it was lost rather than resigned
}

// Leader is who leads an election, as the backend knows it.
type Leader struct {
	Value     string        // what the leader published with Campaign
	Instance  string        // its process (WithInstance)
	Fence     uint64        // its term's fence: every new term has a higher one
	Since     time.Time     // when its term began, by the backend's clock
	Remaining time.Duration // how long its lease runs from when it was read, unless renewed
}

// ErrNoLeader reports an election that nobody leads.
var ErrNoLeader = errors.New("guard: the election has no leader")

// pollLeader bounds how long Observe goes without asking who leads: a term that begins on a
// free name announces nothing.
const pollLeader = time.Second

// NewElection returns the election of name on g. It returns an error matching ErrUnsupported
// when g's backend cannot tell who holds a lock (it does not implement Inspector), and a
// *NameError for a bad name.
func NewElection(g *Guard, name string) (*Election, error) {
	insp, ok := g.backend.(Inspector)
	if !ok {
		return nil, fmt.Errorf("%w: an Election reads who leads, which %s cannot tell (guard.Inspector)", ErrUnsupported, g.backendName)
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	return &Election{g: g, name: name, insp: insp}, nil
}

// Name returns the election's lock name.
func (e *Election) Name() string { return e.name }

// Campaign waits until this instance leads, publishing value, and returns its term: a Lock
// whose context ends when the term does — lost (ErrLockLost), resigned (ErrReleased), with
// the Guard (ErrClosed), or with ctx, which ends the term: it is released then. It waits as Guard.Acquire does: until ctx is done, or up to WaitTime.
// While this Election leads, Campaign returns the current term. Errors are Guard.Acquire's.
func (e *Election) Campaign(ctx context.Context, value string, opts ...LockOption) (*Lock, error) {
	e.mu.Lock()
	if e.term != nil && e.term.Err() == nil {
		term := e.term
		e.mu.Unlock()
		return term, nil
	}
	e.lost = nil // campaigning again: healthy while it waits (Check)
	e.mu.Unlock()
	l, err := e.g.acquire(ctx, e.name, -1, withKind(opts, kindOf(KindTerm, 0, value)))
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.term, e.lost = l, nil
	e.mu.Unlock()
	context.AfterFunc(l.Context(), func() {
		e.mu.Lock()
		cause := l.lossCause()
		if e.term == l {
			e.term = nil
			if cause != nil {
				e.lost = cause
			}
		}
		e.mu.Unlock()
		if cause == nil && !l.isReleased() {
			// The term ended with the context it was campaigned with: it is over, and the name
			// goes to the next candidate now, not when a lease nobody renews runs out.
			_ = l.Release(context.Background())
		}
	})
	return l, nil
}

// Resign ends this instance's term, if it leads, so that another can take over at once; it
// returns what the term's Release returns, and nil when it does not lead.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	term := e.term
	e.term, e.lost = nil, nil
	e.mu.Unlock()
	if term == nil {
		return nil
	}
	return term.Release(ctx)
}

// Leader returns who leads now, wherever it runs. It returns ErrNoLeader when nobody does,
// and the backend's error, wrapped, when it cannot tell.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	info, err := e.insp.Inspect(ctx, e.name)
	if err != nil {
		return Leader{}, &OpError{Op: "inspect", Name: e.name, Err: err}
	}
	if !info.Held || info.Kept {
		return Leader{}, ErrNoLeader
	}
	return Leader{Value: info.Value, Instance: info.Instance, Fence: info.Fence, Since: info.AcquiredAt,
		Remaining: info.Remaining}, nil
}

// Observe reports each leader as it takes over, in order — every term it sees, with a higher
// fence than the one before — on the channel it returns, which is closed when ctx ends or the
// Guard closes. It learns of a change from the backend's release notices, where there are
// any, and asks who leads at least every second and when a leader's lease could run out: a
// term shorter than that may go unseen. The channel holds a few leaders; while it is full,
// Observe waits for the receiver, and reports the leader of the moment when it can again.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader, 8)
	changed := make(chan struct{}, 1)
	var sub Subscription
	if n, ok := e.g.backend.(Notifier); ok {
		if s, err := n.Subscribe(func(Notice) {
			select {
			case changed <- struct{}{}:
			default:
			}
		}); err == nil {
			if s.Watch(ctx, e.name) == nil {
				sub = s
			} else {
				_ = s.Close()
			}
		}
	}
	go func() {
		defer close(out)
		if sub != nil {
			defer sub.Close()
		}
		var last uint64
		for {
			wait := pollLeader
			l, err := e.Leader(ctx)
			if err == nil {
				if l.Fence > last {
					last = l.Fence
					select {
					case out <- l:
					case <-ctx.Done():
						return
					case <-e.g.life.Done():
						return
					}
				}
				wait = min(wait, max(l.Remaining, 10*time.Millisecond))
			}
			t := time.NewTimer(wait)
			select {
			case <-changed:
			case <-t.C:
			case <-ctx.Done():
			case <-e.g.life.Done():
			}
			t.Stop()
			if ctx.Err() != nil || e.g.life.Err() != nil {
				return
			}
		}
	}()
	return out
}

// Check tells a liveness probe whether this instance's part in the election is healthy: nil
// while it does not lead, or leads with a term whose lease it keeps renewing; an error while
// it leads with a term that has gone unrenewed for two thirds of its lease (its context ends
// with ErrLockLost unless a renewal gets through), and after its term was lost, until it
// campaigns again or resigns: a candidate that waits in Campaign is healthy.
func (e *Election) Check() error {
	e.mu.Lock()
	term, lost := e.term, e.lost
	e.mu.Unlock()
	switch {
	case lost != nil:
		return fmt.Errorf("guard: election %q: the term was lost: %w", e.name, lost)
	case term == nil || !term.renewed:
		return nil
	}
	// Against the lease the last grant or renewal set, not the watchdog's timeout: a term
	// handed over with a shorter lease is renewed a third of the way into that lease, and had
	// been reported unrenewed until then (about 1.5 s after a hand-over on a 30 s watchdog).
	if left, span := time.Until(term.Deadline()), e.g.sched.Span(&term.root().lease); left < min(span, e.g.watchdogTTL)/3 {
		return fmt.Errorf("guard: election %q: the term has not been renewed; %v left: %w", e.name, left.Round(time.Millisecond), ErrLockLost)
	}
	return nil
}
