package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Event is one line of a worker's history: what one worker saw, and when, by the wall clock
// in Unix nanoseconds. The processes of a run share one machine and so one CLOCK_REALTIME:
// times from different workers and from the coordinator compare directly.
type Event struct {
	Kind   string `json:"ev"`  // one of the Ev… constants
	Worker int    `json:"w"`   // the worker's number
	Inc    int    `json:"inc"` // its incarnation: 1, then one more per respawn
	At     int64  `json:"at"`  // when, UnixNano

	Call  string `json:"call,omitempty"`  // the acquire call: EvStart, EvGrant, EvFail
	Token string `json:"token,omitempty"` // the acquisition, from EvGrant on
	Name  string `json:"name,omitempty"`  // the lock name: EvStart, EvGrant

	Mode string `json:"mode,omitempty"` // EvStart: ModeWatchdog or ModeLease
	TTL  int64  `json:"ttl,omitempty"`  // EvStart: the lease, ns
	Try  bool   `json:"try,omitempty"`  // EvStart: TryAcquire rather than Acquire
	// Prim is what an acquire call asks for, on EvStart and EvGrant: "" a mutex, PrimPermit a
	// semaphore's permit, PrimRead or PrimWrite a side of a read-write lock.
	Prim string `json:"prim,omitempty"`

	Fence    uint64 `json:"fence,omitempty"`    // EvGrant, EvWrite
	Deadline int64  `json:"deadline,omitempty"` // EvGrant, EvDeadline: the local validity deadline
	Seq      int    `json:"seq,omitempty"`      // EvWrite, EvWrote: the write's number in the acquisition
	Outcome  string `json:"outcome,omitempty"`  // EvFail: busy, error…; EvWrote: accepted, rejected, error
	Err      string `json:"err,omitempty"`      // the error or the context's cause
}

// Kinds of Event.
const (
	EvStart    = "start"    // an acquire call begins (At: before the call)
	EvGrant    = "grant"    // it returned a lock (At: Lock.AcquiredAt, when the reply came back)
	EvFail     = "fail"     // it returned an error
	EvDeadline = "deadline" // the observer reported a renewal or an extension: a new deadline
	EvLost     = "lost"     // the observer reported the loss or lease end (At: when the Guard cancelled)
	EvDone     = "done"     // the worker saw the lock's Done channel closed (At: when it saw it)
	EvRelease  = "release"  // the worker calls Release (At: before the call)
	EvReleased = "released" // Release returned (Err: its error)
	EvExtend   = "extend"   // the worker calls Extend; its new deadline comes as EvDeadline
	EvWrite    = "write"    // a fenced write is sent (At: before it is sent)
	EvWrote    = "wrote"    // its outcome came back
	EvExit     = "exit"     // the worker is done and exits
)

// Primitives, as Event.Prim and Acquisition.Prim name them.
const (
	PrimPermit = "permit" // Semaphore.Acquire
	PrimRead   = "read"   // RWMutex.RLock
	PrimWrite  = "write"  // RWMutex.Lock
)

// Acquisition modes.
const (
	ModeWatchdog = "watchdog" // no LeaseTime: the watchdog renews it
	ModeLease    = "lease"    // LeaseTime: not renewed
)

// Write is one write that reached the Resource, as the Resource logged it.
type Write struct {
	Name     string
	Fence    uint64
	Token    string // the writer's acquisition
	Seq      int
	Arrival  int64 // UnixNano, taken under the Resource's lock: the log is in arrival order
	Accepted bool
}

// Stop is a time a worker process spent stopped by SIGSTOP.
type Stop struct {
	Worker, Inc int
	From, To    int64 // SIGSTOP sent, SIGCONT sent
}

// Kill is a worker process killed by SIGKILL.
type Kill struct {
	Worker, Inc int
	At          int64 // SIGKILL sent
}

// Wipe is a server restart that lost the server's data (kill -9 without persistence): from
// From, when the server was killed, to To, when it answered again, empty. Names are the lock
// names whose data it held.
type Wipe struct {
	Names    []string
	From, To int64
}

// affects reports whether the wipe lost name's data.
func (w Wipe) affects(name string) bool { return slices.Contains(w.Names, name) }

// Fault is one fault the coordinator injected.
type Fault struct {
	Kind     string
	From, To int64 // when it began and ended (equal for instant faults)
	Detail   string
}

// History is what a run recorded: the workers' events, the Resource's log and the
// coordinator's faults.
type History struct {
	Start, End int64   // the run, UnixNano
	Events     []Event // the workers' events, in the order the coordinator read them
	Writes     []Write // the Resource's log, in arrival order
	Stops      []Stop
	Kills      []Kill
	Wipes      []Wipe
	Faults     []Fault

	// Semaphore and Permits are the semaphore name the workers take permits of and how many
	// holders it may have; RW is the read-write lock's name. "": the run had none.
	Semaphore string `json:",omitempty"`
	Permits   int    `json:",omitempty"`
	RW        string `json:",omitempty"`
}

// Acquisition is one granted acquisition, assembled from the events of its worker.
type Acquisition struct {
	Call        string // the acquire call's id
	Token       string // the lock's token: unique per acquisition
	Worker, Inc int
	Name        string
	Prim        string // "" for a mutex, or one of the Prim… constants
	Mode        string
	TTL         time.Duration
	Fence       uint64

	Start int64 // the acquire call began
	Grant int64 // the grant's reply came back (Lock.AcquiredAt)
	// FirstDeadline is the local validity deadline at the grant; Deadline the last one the
	// worker reported (renewals and extensions move it).
	FirstDeadline, Deadline int64

	CtxEnd int64 // the lock's context ended: the earliest of EvLost and EvDone; 0 if not seen
	Cause  string

	// ReleaseCall is when Release was first called; ReleaseDone and ReleaseErr tell how the
	// call that freed the lock returned, or else the first that returned. 0: none.
	ReleaseCall, ReleaseDone int64
	ReleaseErr               string

	Killed int64 // the worker was killed while it held the lock (0: it was not)
}

// String identifies a for messages: its worker, name and fence.
func (a *Acquisition) String() string {
	if a.Prim != "" {
		return fmt.Sprintf("w%d.%d %s %s fence %d (%s %v)", a.Worker, a.Inc, a.Name, a.Prim, a.Fence, a.Mode, a.TTL)
	}
	return fmt.Sprintf("w%d.%d %s fence %d (%s %v)", a.Worker, a.Inc, a.Name, a.Fence, a.Mode, a.TTL)
}

// Acquisitions assembles the granted acquisitions from h's events, in grant order, and counts
// the acquire calls by outcome ("granted", or EvFail's outcome). Events it cannot place (an
// event of a token without a grant) are returned as problems: they mean the harness lost a
// line it should not have.
func (h *History) Acquisitions() (acqs []*Acquisition, calls map[string]int, problems []string) {
	calls = make(map[string]int)
	starts := make(map[string]Event)
	byToken := make(map[string]*Acquisition)
	for _, e := range h.Events {
		switch e.Kind {
		case EvStart:
			starts[e.Call] = e
		case EvFail:
			calls[e.Outcome]++
		case EvGrant:
			calls["granted"]++
			s, ok := starts[e.Call]
			if !ok {
				problems = append(problems, fmt.Sprintf("grant of call %s without its start", e.Call))
				continue
			}
			a := &Acquisition{
				Call: e.Call, Token: e.Token, Worker: e.Worker, Inc: e.Inc, Name: s.Name, Prim: s.Prim,
				Mode: s.Mode, TTL: time.Duration(s.TTL), Fence: e.Fence,
				Start: s.At, Grant: e.At, FirstDeadline: e.Deadline, Deadline: e.Deadline,
			}
			byToken[e.Token] = a
			acqs = append(acqs, a)
		}
	}
	for _, e := range h.Events {
		if e.Token == "" || e.Kind == EvGrant || e.Kind == EvWrite || e.Kind == EvWrote {
			continue
		}
		a := byToken[e.Token]
		if a == nil {
			problems = append(problems, fmt.Sprintf("%s event of token %s without a grant", e.Kind, e.Token))
			continue
		}
		switch e.Kind {
		case EvDeadline:
			// The last one reported, not the latest: an Extend may shorten the lease. The
			// observer reports a lock's events in order.
			a.Deadline = e.Deadline
		case EvLost, EvDone:
			if a.CtxEnd == 0 || e.At < a.CtxEnd {
				a.CtxEnd = e.At
			}
			if a.Cause == "" || e.Kind == EvLost {
				a.Cause = e.Err
			}
		case EvRelease: // the first call counts: a second one (the observer's) is a no-op
			if a.ReleaseCall == 0 {
				a.ReleaseCall = e.At
			}
		case EvReleased: // the release that freed the lock, if one did
			if e.Err == "" || a.ReleaseDone == 0 {
				a.ReleaseDone, a.ReleaseErr = e.At, e.Err
			}
		}
	}
	for _, k := range h.Kills {
		for _, a := range acqs {
			if a.Worker == k.Worker && a.Inc == k.Inc && a.Grant <= k.At &&
				(a.CtxEnd == 0 || a.CtxEnd > k.At) && (a.ReleaseCall == 0 || a.ReleaseCall > k.At) {
				a.Killed = k.At
			}
		}
	}
	slices.SortFunc(acqs, func(x, y *Acquisition) int { return cmp.Compare(x.Grant, y.Grant) })
	return acqs, calls, problems
}

// WindowEnd returns the end of a's validity window, the time after which its holder must no
// longer act as the owner, and how it was found:
//
//   - "ctx": its context ended (the earlier of the Guard's loss event and the worker seeing
//     Done);
//   - "release": its worker called Release, which ends the context first;
//   - "killed": its worker was killed;
//   - "stopped": its worker was stopped by SIGSTOP while its deadline passed (or within
//     stopSlack after it, before the context ended: a timer that was about to fire). The
//     Guard could not cancel the context then — the process ran nothing — so the window ends
//     at the deadline, where the watchdog would have ended it. What the resumed process does
//     before it sees its context ended is the "paused process" case of docs/semantics.md:
//     fencing's job, counted by Check as late writes.
//   - "open": none of these was seen before the run ended (a lost line): the window is
//     taken to last until the end of the run, which can only find more overlaps.
//
// The window starts at a.Grant; it is empty when the end is not after it.
func (h *History) WindowEnd(a *Acquisition) (int64, string) {
	end, how := int64(0), "open"
	take := func(t int64, why string) {
		if t != 0 && (end == 0 || t < end) {
			end, how = t, why
		}
	}
	take(a.CtxEnd, "ctx")
	take(a.ReleaseCall, "release")
	take(a.Killed, "killed")
	for _, s := range h.Stops {
		if s.Worker == a.Worker && s.Inc == a.Inc && s.To > a.Grant &&
			s.From <= a.Deadline+int64(stopSlack) && a.Deadline < s.To && (a.CtxEnd == 0 || a.CtxEnd > s.From) {
			take(max(a.Deadline, a.Grant), "stopped")
		}
	}
	if end == 0 {
		end = h.End
	}
	return end, how
}

// stopSlack is how long after a lock's deadline a SIGSTOP may land and still count as
// having frozen the watchdog before it fired: a few times the lag the runs measure
// (Report.MaxCancelLag).
const stopSlack = 50 * time.Millisecond

// describe renders the events of a's acquisition, times relative to the run's start, for a
// failure message.
func (h *History) describe(a *Acquisition) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v:", a)
	for _, e := range h.Events {
		if (e.Call != "" && e.Call == a.Call) || (e.Token != "" && e.Token == a.Token) {
			fmt.Fprintf(&b, "\n      %s", h.line(e))
		}
	}
	if a.Killed != 0 {
		fmt.Fprintf(&b, "\n      %s worker killed", h.rel(a.Killed))
	}
	for _, s := range h.Stops {
		if s.Worker == a.Worker && s.Inc == a.Inc && s.To > a.Start {
			fmt.Fprintf(&b, "\n      %s worker stopped until %s", h.rel(s.From), h.rel(s.To))
		}
	}
	return b.String()
}

// line renders one event.
func (h *History) line(e Event) string {
	s := fmt.Sprintf("%s w%d.%d %-8s", h.rel(e.At), e.Worker, e.Inc, e.Kind)
	if e.Fence != 0 {
		s += fmt.Sprintf(" fence=%d", e.Fence)
	}
	if e.Deadline != 0 {
		s += " deadline=" + h.rel(e.Deadline)
	}
	if e.Seq != 0 {
		s += fmt.Sprintf(" seq=%d", e.Seq)
	}
	if e.Outcome != "" {
		s += " " + e.Outcome
	}
	if e.Err != "" {
		s += " (" + e.Err + ")"
	}
	return s
}

// rel renders t relative to the run's start, in milliseconds.
func (h *History) rel(t int64) string {
	return fmt.Sprintf("t+%.3fms", float64(t-h.Start)/1e6)
}

// faultsNear renders the faults that were on between from and to (with a margin), for a
// failure message.
func (h *History) faultsNear(from, to int64) string {
	var b strings.Builder
	margin := int64(2 * time.Second)
	for _, f := range h.Faults {
		if f.To >= from-margin && f.From <= to+margin {
			fmt.Fprintf(&b, "\n      %s–%s %s %s", h.rel(f.From), h.rel(f.To), f.Kind, f.Detail)
		}
	}
	if b.Len() == 0 {
		return "\n      (none)"
	}
	return b.String()
}
