package guard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/guardlock/guard/watchdog"
)

// AcquireAll takes every name in names, or none: a transfer between two accounts, an import
// that touches several tenants. It takes them one by one in one canonical order — byte order,
// each name once — so that callers whose sets overlap never wait for each other in a circle,
// and when one name cannot be had (busy, WaitTime ran out, ctx ended, the backend failed) it
// gives back the ones it took and returns that error.
//
// The result is a Lock that holds them all. Its Members are the lock of each name, in that
// order, each with its own token, fence, lease and watchdog; its Name is the names joined by
// ", ", its Fence and Token those of its first member. Its context ends when any member's
// does — one lock lost is the group lost — and its Release releases them all. Options apply
// to every member; WaitTime bounds the whole acquisition, not each name.
//
// Errors: those of Guard.Acquire, for the name that failed; a *NameError for a bad or missing
// name.
func (g *Guard) AcquireAll(ctx context.Context, names []string, opts ...LockOption) (*Lock, error) {
	if len(names) == 0 {
		return nil, &NameError{Name: "", Reason: "AcquireAll needs at least one name"}
	}
	order := slices.Clone(names)
	slices.Sort(order)
	order = slices.Compact(order)
	for _, name := range order {
		if err := CheckName(name); err != nil {
			return nil, err
		}
	}
	s, err := resolve(-1, opts)
	if err != nil {
		return nil, err
	}
	var giveUp time.Time
	if s.waitTime > 0 {
		giveUp = time.Now().Add(s.waitTime)
	}
	if b, ok := g.backend.(Batcher); ok && len(order) > 1 && g.heldInAny(ctx, order) == nil {
		if l, err := g.acquireBatch(ctx, b, order, opts); l != nil || err != nil {
			return l, err
		}
		// Not all free: take them one by one, waiting for each.
	}
	members := make([]*Lock, 0, len(order))
	for _, name := range order {
		memberOpts := opts
		if !giveUp.IsZero() {
			memberOpts = append(slices.Clip(opts), WaitTime(max(time.Until(giveUp), 0)))
		}
		l, err := g.acquire(ctx, name, -1, memberOpts)
		if err != nil {
			for _, m := range slices.Backward(members) {
				_ = m.Release(ctx)
			}
			return nil, err
		}
		members = append(members, l)
	}
	return g.group(ctx, members), nil
}

// acquireBatch makes one attempt to take every name at once with the backend's Batcher. It
// returns the multi-lock, or an error that ends the acquisition, or neither when the names
// were not all free.
func (g *Guard) acquireBatch(ctx context.Context, b Batcher, names []string, opts []LockOption) (*Lock, error) {
	if g.isClosed() {
		return nil, ErrClosed
	}
	qs := make([]*acquisition, len(names))
	ctxs := make([]context.Context, len(names))
	reqs := make([]Request, len(names))
	for i, name := range names {
		q := &acquisition{g: g}
		_ = q.s.resolve(-1, opts) // checked by AcquireAll
		q.begin(name)
		ctxs[i] = ctx
		if g.obs != nil {
			ctxs[i] = g.obs.AcquireStart(ctx, &q.a)
		}
		q.a.Attempts, q.asks, q.sent = 1, 1, q.a.Started
		q.sends[1] = q.sent
		reqs[i] = Request{Name: name, Token: q.w.token, TTL: q.ttl, Instance: g.instance, Label: q.s.label,
			Attempt: 1, Shared: q.s.kind.shared(), Limit: q.s.limit, Value: q.s.value}
		qs[i] = q
	}
	start := qs[0].sent
	fences, err := b.AcquireAll(ctx, reqs)
	answered := time.Now()
	if err == nil && len(fences) != len(reqs) {
		err = fmt.Errorf("backend granted %d names, asked %d", len(fences), len(reqs))
	}
	if err == nil {
		for _, q := range qs {
			if !answered.Before(watchdog.Deadline(start, q.ttl)) {
				err = errLateGrant
			}
		}
	}
	if err != nil {
		var busy *BusyError
		fallBack := errors.As(err, &busy)
		if !fallBack {
			// Any of them may have been taken although we got no answer (or will be, by a
			// request still on its way), or one too late.
			for _, q := range qs {
				g.cleanupInDoubt(q.a.Name, q.w.token)
			}
		}
		for i, q := range qs {
			end := err
			if !fallBack {
				end = &OpError{Op: "acquire", Name: q.a.Name, Err: err}
				if ctx.Err() != nil {
					end = canceled(q.a.Name, ctx)
				}
			}
			_, _ = g.finish(ctxs[i], q, grant{}, end)
		}
		if fallBack {
			return nil, nil
		}
		if ctx.Err() != nil {
			return nil, canceled(names[0], ctx)
		}
		return nil, &OpError{Op: "acquire", Name: names[0], Err: err}
	}
	members := make([]*Lock, 0, len(names))
	for i, q := range qs {
		l, err := g.finish(ctxs[i], q, grant{fence: fences[i], start: start, heldAt: answered, granted: q.ttl}, nil)
		if err != nil {
			for _, m := range slices.Backward(members) {
				_ = m.Release(ctx)
			}
			for _, q := range qs[i+1:] {
				g.cleanup(q.a.Name, q.w.token)
			}
			return nil, err
		}
		members = append(members, l)
	}
	return g.group(ctx, members), nil
}

// heldInAny returns a lock of this Guard that ctx runs under on one of names, if any.
func (g *Guard) heldInAny(ctx context.Context, names []string) *Lock {
	for _, name := range names {
		if l := g.heldIn(ctx, name); l != nil {
			return l
		}
	}
	return nil
}

// group returns the Lock that holds members, whose context ends with the first of theirs.
func (g *Guard) group(ctx context.Context, members []*Lock) *Lock {
	first := members[0]
	names := make([]string, len(members))
	for i, m := range members {
		names[i] = m.name
	}
	l := &Lock{
		g: g, name: strings.Join(names, ", "), token: first.token, label: first.label, kind: first.kind,
		fence: first.fence, renewed: first.renewed, start: first.start, heldAt: members[len(members)-1].heldAt,
		prev: innermost(ctx), members: members,
	}
	l.startContext(ctx)
	for _, m := range members {
		m.group.Store(l) // a member that ends ends the group (Lock.cancel)
		if m.Context().Err() != nil {
			l.cancel(context.Cause(m.Context()))
		}
	}
	return l
}

// Members returns the locks a multi-lock (AcquireAll) holds, in canonical order; nil for any
// other lock.
func (l *Lock) Members() []*Lock { return slices.Clone(l.members) }

// releaseGroup releases every member of a multi-lock, last first, and ends its context with
// ErrReleased. It returns the members' errors, joined.
func (l *Lock) releaseGroup(ctx context.Context) error {
	l.cancel(ErrReleased)
	var errs []error
	for _, m := range slices.Backward(l.members) {
		errs = append(errs, m.Release(ctx))
	}
	return errors.Join(errs...)
}
