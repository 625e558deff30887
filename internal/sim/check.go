package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/guardlock/guard"
)

// Report is what a run did and what its checks found.
type Report struct {
	Seed         uint64
	Simulated    time.Duration // simulated time
	Acquisitions int64
	Requests     int64
	Calls        map[string]int64 // requests by kind
	Faults       map[string]int64 // by kind
	Checked      map[string]int   // what each invariant looked at
	// IdleAfterRelease and IdleAfterExpiry are the longest a free name sat with a live caller
	// waiting for it, in calm spells, after a release or a kept window ended, and after a
	// lease ran out.
	IdleAfterRelease, IdleAfterExpiry time.Duration
	Violations                        []string
}

// Failed reports whether a check failed.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d acquisitions, %d requests (%v) in %v simulated; faults %v; checked %v; idle ≤ %v after a release, ≤ %v after an expiry",
		r.Seed, r.Acquisitions, r.Requests, r.Calls, r.Simulated.Round(time.Millisecond), r.Faults, r.Checked,
		r.IdleAfterRelease, r.IdleAfterExpiry)
	for _, v := range r.Violations {
		b.WriteString("\n  VIOLATION " + v)
	}
	return b.String()
}

// Bounds the checks hold the engine to, from the run's configuration.
func tightIdle(c *Config) time.Duration {
	// A notice's delay, a jittered wake-up, an attempt's round trip, scheduling.
	return c.Net.noticeDelay + 11*time.Millisecond + 4*c.Net.maxLeg + 5*time.Millisecond
}

func looseIdle(c *Config) time.Duration {
	// Half the longest place in a queue: a waiter whose information about the holder is
	// stale asks again within half its place.
	place := min(c.QueueTimeout, max(maxWatchdog, maxLease))
	return place/2 + tightIdle(c)
}

func closeBound(c *Config) time.Duration {
	// Releases out (two requests each), and background work: resent releases until the
	// longest lease could have run out.
	return 2*c.Net.driverTimeout + max(maxWatchdog, maxLease) + c.Net.late + 50*time.Millisecond
}

// calmLeadIn is how long before an idle name every fault must have been over for the tight
// bounds to apply: a waiter's backoff, a watch retried, a place in a queue.
func calmLeadIn(c *Config) time.Duration { return 2*time.Second + c.QueueTimeout }

// check verifies a finished run's history.
func check(r *run, end time.Time) *Report {
	h := r.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	rep := &Report{
		Seed: r.cfg.Seed, Simulated: end.Sub(r.epoch), Acquisitions: r.stats.acquisitions.Load(),
		Requests: r.stats.requests.Load(), Checked: make(map[string]int), Violations: append([]string(nil), h.problems...),
	}
	st := &r.stats
	rep.Calls = map[string]int64{"acquire": st.acquires.Load(), "extend": st.extendCalls.Load(), "release": st.releases.Load()}
	rep.Faults = map[string]int64{
		"lost-request": st.lostRequests.Load(), "lost-reply": st.lostReplies.Load(),
		"late-reply": st.lateReplies.Load(), "slow-request": st.slowRequests.Load(),
		"notice-lost": st.noticesLost.Load(), "notice-dup": st.noticesDuplicated.Load(),
		"notice-late": st.noticesLate.Load(), "watch-failed": st.watchFailures.Load(),
		"watch-slow": st.slowWatches.Load(), "pause": st.pauses.Load(), "kill": st.kills.Load(),
		"restart": st.restarts.Load(), "force-release": st.forced.Load(), "close": st.closes.Load(),
		"cancelled-release": st.cancelledReleases.Load(), "cancelled-wait": st.cancelledWaits.Load(),
		"observer-release": st.observerReleases.Load(), "extend": st.extends.Load(), "reentry": st.reentries.Load(),
		"multi-lock": st.multi.Load(),
	}
	c := &checker{r: r, h: h, end: end, rep: rep}
	c.index()
	c.windows()
	c.fences()
	c.idle()
	c.minHold()
	c.calls()
	return rep
}

type checker struct {
	r   *run
	h   *history
	end time.Time
	rep *Report

	killedAt map[int]time.Time
	byToken  map[string][]*tenure // a token's tenures
	byName   map[string][]*tenure // each name's tenures, by start
}

func (c *checker) fail(format string, args ...any) {
	if len(c.rep.Violations) < 20 {
		c.rep.Violations = append(c.rep.Violations, fmt.Sprintf(format, args...))
	}
}

func (c *checker) at(t time.Time) time.Duration { return t.Sub(c.r.epoch) }

func (c *checker) index() {
	c.killedAt = make(map[int]time.Time)
	for _, e := range c.h.procs {
		if e.to.IsZero() {
			c.killedAt[e.proc] = e.from
		}
	}
	c.byToken = make(map[string][]*tenure)
	c.byName = make(map[string][]*tenure)
	for i := range c.h.tenures {
		t := &c.h.tenures[i]
		if t.end.IsZero() {
			t.end = c.end
		}
		c.byToken[t.token] = append(c.byToken[t.token], t)
		c.byName[t.name] = append(c.byName[t.name], t)
	}
	for _, ts := range c.byName {
		slices.SortFunc(ts, func(a, b *tenure) int { return a.start.Compare(b.start) })
	}
}

// disturbed reports whether the server lost or broke name's state between from and to: a
// restart, or an operator's forced release. Exclusion then holds only by fences.
func (c *checker) disturbed(name string, from, to time.Time) bool {
	for _, t := range c.h.restarts {
		if !t.Before(from) && !t.After(to) {
			return true
		}
	}
	for _, f := range c.h.forced {
		if f.name == name && !f.at.Before(from) && !f.at.After(to) {
			return true
		}
	}
	return false
}

// window returns when a's holder trusted its lock: from the grant it learned of to the end
// of its context, or its process's death.
func (c *checker) window(a *acquisition) (time.Time, time.Time) {
	end := a.end
	if end.IsZero() {
		end = c.end
	}
	if k, ok := c.killedAt[a.proc]; ok && k.Before(end) {
		end = k
	}
	return a.at, end
}

func (c *checker) tenureOf(a *acquisition) *tenure {
	for _, t := range c.byToken[a.token] {
		if t.fence == a.fence {
			return t
		}
	}
	return nil
}

// windows checks invariant (a): an exclusive validity window of a name never overlaps
// another window of it, shared windows never outnumber their limit, and each window lies
// within its holder's tenure on the server.
func (c *checker) windows() {
	type edge struct {
		at    time.Time
		open  bool
		a     *acquisition
		index int
	}
	byName := make(map[string][]edge)
	for i, a := range c.h.acqs {
		from, to := c.window(a)
		if !to.After(from) {
			continue // never trusted: its context ended before Acquire returned it (an observer released it)
		}
		t := c.tenureOf(a)
		if t != nil && c.disturbed(a.name, t.start, to) || c.disturbed(a.name, from, to) {
			continue
		}
		c.rep.Checked["windows"]++
		if t == nil {
			c.fail("(b) %s: p%d was granted fence %d, which the server never gave its token", a.name, a.proc, a.fence)
		} else if from.Before(t.start) || to.After(t.end) {
			c.fail("(a) %s: p%d trusted fence %d over %v–%v, outside its tenure on the server %v–%v (%s)",
				a.name, a.proc, a.fence, c.at(from), c.at(to), c.at(t.start), c.at(t.end), t.why)
		}
		byName[a.name] = append(byName[a.name], edge{from, true, a, i}, edge{to, false, a, i})
	}
	for name, edges := range byName {
		// Ends before starts at one instant: a window that ends as another begins is not an
		// overlap.
		slices.SortFunc(edges, func(x, y edge) int {
			if c := x.at.Compare(y.at); c != 0 {
				return c
			}
			if x.open != y.open {
				if x.open {
					return 1
				}
				return -1
			}
			return 0
		})
		open := make(map[int]*acquisition)
		for _, e := range edges {
			if !e.open {
				delete(open, e.index)
				continue
			}
			for _, o := range open {
				if !e.a.shared || !o.shared || c.disturbed(name, o.at, e.at) {
					if !c.disturbed(name, o.at, e.at) {
						c.fail("(a) %s: p%d (fence %d, shared %t) and p%d (fence %d, shared %t) held it at once from %v",
							name, o.proc, o.fence, o.shared, e.a.proc, e.a.fence, e.a.shared, c.at(e.at))
					}
					break
				}
			}
			if e.a.shared && e.a.limit > 0 && len(open) >= e.a.limit {
				c.fail("(a) %s: %d holders at once from %v, with %d permits", name, len(open)+1, c.at(e.at), e.a.limit)
			}
			open[e.index] = e.a
		}
	}
}

// fences checks invariant (b): per name, fences strictly increase in grant order.
func (c *checker) fences() {
	for name, ts := range c.byName {
		for i := 1; i < len(ts); i++ {
			c.rep.Checked["fences"]++
			if ts[i].fence <= ts[i-1].fence {
				c.fail("(b) %s: fence %d granted at %v after fence %d at %v", name,
					ts[i].fence, c.at(ts[i].start), ts[i-1].fence, c.at(ts[i-1].start))
			}
		}
	}
}

// calm reports whether no fault of any kind struck between from and to.
func (c *checker) calm(from, to time.Time) bool {
	overlaps := func(a, b time.Time) bool { return a.Before(to) && (b.IsZero() || b.After(from)) }
	for _, s := range c.h.faulty {
		if overlaps(s.from, s.to) {
			return false
		}
	}
	for _, e := range c.h.procs {
		if overlaps(e.from, e.to) {
			return false
		}
	}
	for _, t := range c.h.restarts {
		if overlaps(t, t.Add(time.Nanosecond)) {
			return false
		}
	}
	for _, f := range c.h.forced {
		if overlaps(f.at, f.at.Add(time.Nanosecond)) {
			return false
		}
	}
	return true
}

// idle checks invariant (c): in calm spells, a name that is free on the server while a live
// caller waits for it is granted within a bound — tight after a release or the end of a kept
// window (the waiters were told, or learned when it ends), looser after a lease ran out
// (a waiter whose news of the holder was stale asks again within half its place).
func (c *checker) idle() {
	type held struct {
		from, to time.Time
		why      endReason
		kept     bool
	}
	byName := make(map[string][]held)
	for name, ts := range c.byName {
		if name == permitName || name == rwName {
			continue // shared: a name is not simply free or taken
		}
		for _, t := range ts {
			byName[name] = append(byName[name], held{t.start, t.end, t.why, false})
		}
	}
	for _, k := range c.h.keeps {
		if k.name != permitName && k.name != rwName {
			byName[k.name] = append(byName[k.name], held{k.from, k.to, endExpired, true})
		}
	}
	waits := make(map[string][]wait)
	for _, w := range c.h.waits {
		waits[w.name] = append(waits[w.name], w)
	}
	tight, loose, lead := tightIdle(&c.r.cfg), looseIdle(&c.r.cfg), calmLeadIn(&c.r.cfg)
	settle := 2 * c.r.cfg.Net.maxLeg // a waiter has had its first answer
	for name, hs := range byName {
		slices.SortFunc(hs, func(a, b held) int { return a.from.Compare(b.from) })
		var cover time.Time // the end of what is held so far
		var coverWhy endReason
		var coverKept bool
		for _, h := range hs {
			if !cover.IsZero() && h.from.After(cover) {
				c.gap(name, cover, h.from, coverWhy, coverKept, waits[name], tight, loose, lead, settle)
			}
			if h.to.After(cover) {
				cover, coverWhy, coverKept = h.to, h.why, h.kept
			}
		}
	}
}

// gap checks one spell [from, to) in which name was free.
func (c *checker) gap(name string, from, to time.Time, why endReason, kept bool, waits []wait, tight, loose, lead, settle time.Duration) {
	bound := loose
	if why == endReleased || kept {
		bound = tight
	}
	if !c.calm(from.Add(-lead), to) {
		return
	}
	for _, w := range waits {
		if w.start.After(from.Add(-settle)) || w.end.Before(from.Add(bound)) {
			continue // it had no answer yet when the name became free, or left within the bound
		}
		if c.stoppedDuring(w.proc, w.start, from.Add(bound)) {
			continue
		}
		c.rep.Checked["idle"]++
		idle := to.Sub(from)
		if why == endReleased || kept {
			c.rep.IdleAfterRelease = max(c.rep.IdleAfterRelease, idle)
		} else {
			c.rep.IdleAfterExpiry = max(c.rep.IdleAfterExpiry, idle)
		}
		if idle > bound {
			next := "nobody"
			watch := map[string]bool{}
			for _, t := range c.byName[name] {
				if !t.start.Before(to) {
					next = fmt.Sprintf("fence %d (handed over: %t, by p%d)", t.fence, t.handedOver, c.procOf(t.token))
					watch[t.token] = true
					break
				}
			}
			for _, st := range c.h.trail {
				if st.name == name && !st.at.Before(from) && !st.at.After(to) {
					for _, tok := range st.queue {
						watch[tok] = true
					}
				}
			}
			var trail strings.Builder
			for _, st := range c.h.trail {
				recent := !st.at.Before(from.Add(-100*time.Millisecond)) && !st.at.After(to)
				mine := watch[st.token] && !st.at.Before(from.Add(-2*time.Second)) && !st.at.After(to)
				if st.name == name && (recent || mine) {
					fmt.Fprintf(&trail, "\n      %v %s", c.at(st.at), st.what)
				}
			}
			c.fail("(c) %s: free for %v from %v (after its holder %s) while p%d waited (%v–%v); then %s; bound %v%s",
				name, idle, c.at(from), map[bool]string{true: "kept it", false: why.String()}[kept], w.proc,
				c.at(w.start), c.at(w.end), next, bound, trail.String())
		}
		return
	}
}

// procOf returns the process of the acquisition with token, or -1.
func (c *checker) procOf(token string) int {
	for _, a := range c.h.acqs {
		if a.token == token {
			return a.proc
		}
	}
	return -1
}

func (c *checker) stoppedDuring(proc int, from, to time.Time) bool {
	for _, e := range c.h.procs {
		if e.proc == proc && e.from.Before(to) && (e.to.IsZero() || e.to.After(from)) {
			return true
		}
	}
	return false
}

// minHold checks invariant (e): a MinHold window is never shortened — the next holder of the
// name is granted no sooner than MinHold after the grant, in real time, whichever way the
// server's clock runs within the 1 % allowed for (by the server's clock when the lock was not
// released but ran out) — unless the lock was lost, its process stopped, or the server's state
// was lost or broken meanwhile.
func (c *checker) minHold() {
	for _, a := range c.h.acqs {
		if a.minHold == 0 || errors.Is(a.cause, guard.ErrLockLost) || a.name == permitName || a.name == rwName {
			continue
		}
		t := c.tenureOf(a)
		if t == nil {
			continue
		}
		windowEnd := t.start.Add(a.minHold)
		if t.why == endExpired {
			// Not released: the name was taken until the lease ran out, by the server's clock
			// (a lease no longer than the window, or a holder that stopped renewing).
			windowEnd = t.start.Add(time.Duration(float64(a.minHold) / (1 + c.r.server.rate)))
		}
		if c.disturbed(a.name, t.start, windowEnd) || c.stoppedDuring(a.proc, t.start, windowEnd) {
			continue
		}
		if t.why == endExpired && t.end.Before(windowEnd) && !c.calm(t.start, windowEnd) {
			// Its release did not reach the server before the lease ran out: the network lost
			// it, and with it the rest of the window.
			continue
		}
		if k, ok := c.killedAt[a.proc]; ok && k.Before(windowEnd) {
			continue
		}
		c.rep.Checked["minhold"]++
		for _, next := range c.byName[a.name] {
			if next.start.After(t.start) && next.token != t.token {
				if next.start.Before(windowEnd) {
					c.fail("(e) %s: p%d's MinHold(%v) window from %v was cut short: fence %d granted at %v (the lock: fence %d, ttl %v, fixed %t, at %v, ended %v: %v; tenure ended %v: %s)",
						a.name, a.proc, a.minHold, c.at(t.start), next.fence, c.at(next.start),
						a.fence, a.ttl, a.fixed, c.at(a.at), c.at(a.end), a.cause, c.at(t.end), t.why)
				}
				break
			}
		}
	}
}

// calls checks invariant (f): every Release, Close and bounded wait returns within its bound.
func (c *checker) calls() {
	for _, call := range c.h.calls {
		if call.interrupted || call.bound == 0 {
			continue
		}
		c.rep.Checked["calls"]++
		if took := call.end.Sub(call.start); took > call.bound {
			c.fail("(f) p%d's %s took %v from %v; bound %v", call.proc, call.what, took, c.at(call.start), call.bound)
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
