package sim

import (
	"sync"
	"time"
)

// endReason says how a tenure ended on the server.
type endReason uint8

const (
	endOpen     endReason = iota // still held when the run ended
	endReleased                  // its holder released it (freed, kept or handed over)
	endExpired                   // its lease ran out
	endForced                    // an operator's ForceRelease
	endRestart                   // the server restarted and lost it
)

var endNames = [...]string{"open", "released", "expired", "forced", "restart"}

func (r endReason) String() string { return endNames[r] }

// tenure is one holder's time with a name, as the server saw it, in simulated time.
type tenure struct {
	name       string
	token      string
	fence      uint64
	start, end time.Time
	why        endReason
	handedOver bool
}

// acquisition is one grant, as its caller saw it: from Acquire's return to the end of the
// lock's context, or the kill of its process, whichever came first.
type acquisition struct {
	proc       int
	name       string
	token      string
	fence      uint64
	at         time.Time // when Acquire returned the lock
	end        time.Time // when its context ended (zero: still live at the end of the run)
	cause      error     // why it ended
	ttl        time.Duration
	fixed      bool // LeaseTime
	shared     bool // a permit or a reader
	limit      int  // a permit's
	minHold    time.Duration
	releasedAt time.Time // when its holder's Release began (zero: never released)
	lost       bool      // ended with ErrLockLost or ErrLeaseExpired
}

// call is one bounded call of the workload: a Release, a Close, or a wait with WaitTime.
type call struct {
	what        string
	proc        int
	start, end  time.Time
	bound       time.Duration
	interrupted bool // its process was paused or killed meanwhile: no bound holds
}

// wait is one Acquire that waited, for the bound on idle names: from its first busy answer
// (as far as the observer can tell, its start) to its end.
type wait struct {
	proc       int
	name       string
	start, end time.Time
}

// procEvent is a pause (until resumed) or a kill of a process.
type procEvent struct {
	proc     int
	from, to time.Time // to is zero for a kill: for good
	maxAsk   time.Duration
}

// history is everything a run records, in simulated time.
type history struct {
	mu       sync.Mutex // protects everything below
	tenures  []tenure
	acqs     []*acquisition
	calls    []call
	waits    []wait
	procs    []procEvent
	keeps    []keep
	restarts []time.Time
	forced   []forced
	problems []string // violations found while the run went on
	faulty   []span   // times when network faults were on
	trail    []step   // what the server did, for the reports of violations (Config.Trail)

	keepTrail bool
}

// step is one thing the server did with a name, for the report of a violation.
type step struct {
	at    time.Time
	name  string
	token string   // the request's or the release's token
	queue []string // the name's queue after a busy answer
	what  string
}

func (h *history) log(at time.Time, name, token string, queue func() []string, what func() string) {
	if !h.keepTrail {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var q []string
	if queue != nil {
		q = queue()
	}
	h.trail = append(h.trail, step{at, name, token, q, what()})
}

type forced struct {
	name string
	at   time.Time
}

type keep struct {
	name     string
	from, to time.Time
}

type span struct{ from, to time.Time }

func (h *history) startTenure(name, token string, fence uint64, at time.Time, handedOver bool) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tenures = append(h.tenures, tenure{name: name, token: token, fence: fence, start: at, handedOver: handedOver})
	return len(h.tenures) - 1
}

func (h *history) endTenure(i int, at time.Time, why endReason) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tenures[i].end, h.tenures[i].why = at, why
}

func (h *history) extendTenure(int) {}

func (h *history) keep(name string, from, to time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.keeps = append(h.keeps, keep{name, from, to})
}

func (h *history) restart(at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.restarts = append(h.restarts, at)
}

func (h *history) force(name string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.forced = append(h.forced, forced{name, at})
}

func (h *history) violation(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.problems = append(h.problems, s)
}

func (h *history) acquired(a *acquisition) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acqs = append(h.acqs, a)
}

// ended records the end of a's context.
func (h *history) ended(a *acquisition, at time.Time, cause error, lost bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a.end, a.cause, a.lost = at, cause, lost
}

func (h *history) releasing(a *acquisition, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if a.releasedAt.IsZero() {
		a.releasedAt = at
	}
}

func (h *history) called(c call) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, c)
}

func (h *history) waited(w wait) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waits = append(h.waits, w)
}

func (h *history) procEvent(e procEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.procs = append(h.procs, e)
}

func (h *history) faultSpan(from, to time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faulty = append(h.faulty, span{from, to})
}
