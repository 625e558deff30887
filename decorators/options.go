package decorators

import (
	"context"
	"errors"
	"fmt"

	"github.com/guardlock/guard"
)

// Option chooses what a decorated call holds: a Semaphore's permit (Permits) or a side of an
// RWMutex (Read, Write) instead of the name's lock. An Option is a guard.LockOption, so it goes
// in one list with guard's options: decorators.Func(g, t, fn, guard.WaitTime(d), Permits(3)).
// A Guard ignores it. Options only record their values: Func and Job check them.
type Option struct {
	guard.EmptyLockOption
	set func(*primitive)
}

// Permits makes each call hold one of n permits of a guard.Semaphore on the rendered name
// instead of its lock: up to n calls with the same name run at once, across processes — "at
// most 3 imports per tenant". A call that finds every permit taken returns a *guard.BusyError
// whose Kind is guard.KindPermit. Default: the name's lock, one call at a time. n must be at
// least 1; Permits cannot be combined with Read or Write, nor given to FuncAll.
func Permits(n int) Option {
	return Option{set: func(p *primitive) { p.permits, p.permitsSet = n, true }}
}

// Read makes each call hold the read side of a guard.RWMutex on the rendered name: calls with
// Read run together, while no call with Write (nor a lock of the name) holds it. A call that
// finds a writer returns a *guard.BusyError whose Kind is guard.KindRead. Read and Write choose
// the side: the last one given counts. Default: the name's lock.
func Read() Option {
	return Option{set: func(p *primitive) { p.side = guard.KindRead }}
}

// Write makes each call hold the write side of a guard.RWMutex on the rendered name: alone,
// as with the name's lock, but telemetry records it as a writer (guard.KindWrite), and a
// waiting writer is not passed by readers that come after it. A call that finds the name held
// returns a *guard.BusyError whose Kind is guard.KindWrite. Default: the name's lock.
func Write() Option {
	return Option{set: func(p *primitive) { p.side = guard.KindWrite }}
}

// primitive is what a decorator's calls hold, as its Options chose.
type primitive struct {
	permits    int
	permitsSet bool       // Permits was given
	side       guard.Kind // KindRead or KindWrite when Read or Write was given, else KindMutex
}

// noValue prints as nothing: the value of an option without arguments in an OptionError.
type noValue struct{}

func (noValue) String() string { return "" }

// probeName is a lock name that a check of the Guard's backend uses; nothing locks it.
const probeName = "guard/decorators:probe"

// choose reads the Options among opts and checks them against g's backend: a Semaphore or an
// RWMutex needs shared holds (an error matching guard.ErrUnsupported without them). It
// returns a *guard.OptionError for a bad or conflicting option; with multi set (FuncAll), for
// any of them.
func choose(g *guard.Guard, opts []guard.LockOption, multi bool) (primitive, error) {
	var p primitive
	for _, o := range opts {
		if o, ok := o.(Option); ok && o.set != nil {
			o.set(&p)
		}
	}
	sideName := "Read"
	if p.side == guard.KindWrite {
		sideName = "Write"
	}
	switch {
	case multi && p.permitsSet:
		return p, &guard.OptionError{Option: "Permits", Value: p.permits, Reason: "FuncAll takes every name's lock, not permits"}
	case multi && p.side != guard.KindMutex:
		return p, &guard.OptionError{Option: sideName, Value: noValue{}, Reason: "FuncAll takes every name's lock, not a side of it"}
	case p.permitsSet && p.permits < 1:
		return p, &guard.OptionError{Option: "Permits", Value: p.permits, Reason: "must be at least 1"}
	case p.permitsSet && p.side != guard.KindMutex:
		return p, &guard.OptionError{Option: "Permits", Value: p.permits, Reason: "cannot be combined with " + sideName + "(): a semaphore has no sides"}
	case p.permitsSet:
		if _, err := g.Semaphore(probeName, p.permits); err != nil {
			return p, err
		}
	case p.side != guard.KindMutex:
		if _, err := g.RWMutex(probeName); err != nil {
			return p, err
		}
	}
	return p, nil
}

// do takes what p says on name — one attempt unless acq has a WaitTime —, runs fn under it and
// releases it, as guard.Guard.Do does.
func (p primitive) do(ctx context.Context, g *guard.Guard, name string, fn func(context.Context) error, acq []guard.LockOption) error {
	switch {
	case p.permitsSet:
		s, err := g.Semaphore(name, p.permits)
		if err != nil {
			return err
		}
		return s.Do(ctx, fn, acq...)
	case p.side != guard.KindMutex:
		m, err := g.RWMutex(name)
		if err != nil {
			return err
		}
		var l *guard.Lock
		if p.side == guard.KindRead {
			l, err = m.RLock(ctx, acq...)
		} else {
			l, err = m.Lock(ctx, acq...)
		}
		if err != nil {
			return err
		}
		return run(ctx, l, fn)
	}
	return g.Do(ctx, name, fn, acq...)
}

// run runs fn under l and releases it, with what guard.Guard.Do returns: fn's error, joined
// with the cause when l was lost or its lease ran out meanwhile, or with guard.ErrLockLost
// when the release found l no longer held. Another release failure is the observer's to
// report, not the call's.
func run(ctx context.Context, l *guard.Lock, fn func(context.Context) error) (err error) {
	defer func() {
		if rerr := l.Release(ctx); errors.Is(rerr, guard.ErrNotHeld) && lossCause(l) == nil {
			err = errors.Join(err, fmt.Errorf("%w: found at release", guard.ErrLockLost))
		}
	}()
	err = fn(l.Context())
	if cause := lossCause(l); cause != nil && !errors.Is(err, cause) {
		err = errors.Join(err, cause)
	}
	return err
}

// lossCause returns why l's context ended when l was lost or its lease ran out, else nil.
func lossCause(l *guard.Lock) error {
	cause := l.Err()
	if errors.Is(cause, guard.ErrLockLost) || errors.Is(cause, guard.ErrLeaseExpired) {
		return cause
	}
	return nil
}
