package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Report is what Check found in a history, with the run's figures.
type Report struct {
	Backend  string
	Seed     uint64
	Duration time.Duration // of the run: from the first worker's start until all stopped

	Workers      int            // worker processes started, respawns included
	Calls        map[string]int // acquire calls by outcome: granted, busy, timeout, error…
	Acquisitions int            // granted acquisitions
	Faults       map[string]int // faults injected, by kind

	// Property 1: pairs of acquisitions of one name whose validity windows intersect.
	Overlaps int
	// DataLossOverlaps are overlaps that follow a restart that lost the server's data while
	// the first holder held the lock: docs/semantics.md says two holders are then possible,
	// and that fences are what protects the resource. Not a failure; counted apart.
	DataLossOverlaps int

	// Property 2: porcupine's verdict over all names: "ok", or what failed.
	Linearizable string

	// Property 3, from the Resource's log.
	WritesAccepted int
	StaleAccepted  int // accepted with a fence below one accepted before: must be 0
	StaleRejected  int // refused for that reason: fencing at work
	// LateWrites were sent after the writer's validity window ended: by a process stopped
	// past its deadline, before it saw its context end, or by a write that raced with the
	// cancellation (checked the context just before it ended). LateAccepted of them were
	// accepted because no newer holder had written yet: harmless, still in fence order.
	LateWrites, LateAccepted int

	// Property 4: holders whose context was still live when the next holder of the name was
	// granted — the server had let their lease go while they still trusted it.
	Outlived int
	// MaxCancelLag is the longest a lock's context ended after its own local deadline (not
	// counting stopped or killed workers): how late the watchdog fired on this machine.
	MaxCancelLag time.Duration

	// Primitives (Semaphore, RWMutex), besides the mutex: grants, and acquire calls by
	// primitive and outcome ("permit granted", "read timeout"…).
	PrimGrants int
	PrimCalls  map[string]int
	// Property 5: at each permit's grant, the live permits of the semaphore, that one
	// included, must be no more than History.Permits. PermitChecks is how many grants were
	// judged, MaxPermitHolders the most live at once, PermitExcess the grants above the limit.
	PermitChecks, MaxPermitHolders, PermitExcess int
	// Property 6: pairs of read-write holds whose windows intersect with a writer in them.
	RWChecks, RWOverlaps int
	// Property 7: grants of a primitive's name whose fence is not above the fence of every
	// grant of that name that returned before their call began.
	FenceDisorders int
	// PrimDataLoss are the excesses and overlaps of properties 5 and 6 excused by a restart
	// that lost the server's data, as DataLossOverlaps are.
	PrimDataLoss int

	// Violations explain each failure, with history excerpts. Problems are defects of the
	// harness itself (a lost line, a write the Resource judged wrongly): they fail too.
	Violations []string
	Problems   []string

	// HistoryFile is where Run saved the history, as JSON (in the test's artifact directory:
	// kept with go test -artifacts), or "".
	HistoryFile string
}

// Failed reports whether a guarantee broke or the history could not be trusted.
func (r *Report) Failed() bool { return len(r.Violations) > 0 || len(r.Problems) > 0 }

// Summary is the report in one line.
func (r *Report) Summary() string {
	return fmt.Sprintf("%s: %d acquisitions (%d calls), %d faults %s, overlaps %d (+%d after data loss), "+
		"stale writes accepted %d / rejected %d (of %d accepted; late %d), outlived leases %d, "+
		"linearizable: %s, max cancel lag %v; primitives: %d grants, permits above the limit %d "+
		"(%d grants checked, at most %d live), read-write overlaps %d (%d writer grants checked), "+
		"fence disorders %d, excused after data loss %d; seed %d",
		r.Backend, r.Acquisitions, sum(r.Calls), sum(r.Faults), formatCounts(r.Faults),
		r.Overlaps, r.DataLossOverlaps, r.StaleAccepted, r.StaleRejected, r.WritesAccepted,
		r.LateWrites, r.Outlived, r.Linearizable, r.MaxCancelLag.Round(time.Microsecond),
		r.PrimGrants, r.PermitExcess, r.PermitChecks, r.MaxPermitHolders, r.RWOverlaps, r.RWChecks,
		r.FenceDisorders, r.PrimDataLoss, r.Seed)
}

// Details are the figures Summary leaves out, in one line.
func (r *Report) Details() string {
	return fmt.Sprintf("%s: %v of chaos, %d worker processes (respawns included), acquire calls %s, "+
		"primitive calls %s, writes sent late %d (accepted before a newer holder wrote: %d), history %s (kept with go test -artifacts)",
		r.Backend, r.Duration.Round(time.Millisecond), r.Workers, formatCounts(r.Calls), formatCounts(r.PrimCalls),
		r.LateWrites, r.LateAccepted, cmp.Or(r.HistoryFile, "not saved"))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func formatCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// porcupineTimeout bounds the linearizability search per name; the histories of a bounded
// run take milliseconds.
const porcupineTimeout = time.Minute

// Check verifies the four properties on h and returns the report; r.Failed says whether a
// guarantee broke. When porcupine finds a name's history not linearizable, Check writes its
// timeline as HTML into dir (when dir is not "") and names the file in the violation.
func Check(h *History, dir string) *Report {
	r := &Report{Faults: map[string]int{}}
	for _, f := range h.Faults {
		r.Faults[f.Kind]++
	}
	all, calls, problems := h.Acquisitions()
	r.Problems = append(r.Problems, problems...)
	r.Calls, r.PrimCalls = calls, h.primCalls(calls)

	var acqs []*Acquisition // the mutex's
	byName, prims := map[string][]*Acquisition{}, map[string][]*Acquisition{}
	for _, a := range all {
		if a.Prim != "" {
			prims[a.Name] = append(prims[a.Name], a)
			r.PrimGrants++
			continue
		}
		acqs = append(acqs, a)
		byName[a.Name] = append(byName[a.Name], a)
	}
	r.Acquisitions = len(acqs)
	names := slices.Sorted(maps.Keys(byName))
	for _, name := range names {
		h.checkWindows(r, byName[name])
	}
	h.checkLinearizable(r, names, acqs, dir)
	for _, name := range slices.Sorted(maps.Keys(prims)) {
		h.checkShared(r, prims[name])
		h.checkFenceOrder(r, prims[name])
	}
	h.checkWrites(r, all)
	h.cancelLag(r, all)
	return r
}

// primCalls moves the primitives' acquire calls out of calls, the counts by outcome of every
// call, and returns them counted by primitive and outcome.
func (h *History) primCalls(calls map[string]int) map[string]int {
	prim := map[string]string{}
	counts := map[string]int{}
	for _, e := range h.Events {
		outcome := e.Outcome
		switch e.Kind {
		case EvStart:
			if e.Prim != "" {
				prim[e.Call] = e.Prim
			}
			continue
		case EvGrant:
			outcome = "granted"
		case EvFail:
		default:
			continue
		}
		if p := prim[e.Call]; p != "" {
			calls[outcome]--
			if calls[outcome] == 0 {
				delete(calls, outcome)
			}
			counts[p+" "+outcome]++
		}
	}
	return counts
}

// checkShared checks properties 5 and 6 on the grants of one primitive's name, in grant order,
// with the windows property 1 judges: [Grant, WindowEnd).
//
// Property 5, for a semaphore: the permits live at a permit's grant — granted before it, their
// windows not ended — number fewer than History.Permits. Property 6, for a read-write lock: no
// writer's window intersects another hold's. A hold whose data a restart lost before the
// later grant is excused, as for the mutex (lostData).
func (h *History) checkShared(r *Report, acqs []*Acquisition) {
	ends := make([]int64, len(acqs))
	for i, a := range acqs {
		ends[i], _ = h.WindowEnd(a)
	}
	empty := func(i int) bool { return ends[i] <= acqs[i].Grant }
	for i, b := range acqs {
		if empty(i) {
			continue
		}
		var live []*Acquisition
		excused := 0
		for j := range i {
			a := acqs[j]
			if empty(j) || ends[j] <= b.Grant {
				continue
			}
			if b.Prim == PrimPermit && a.Prim != PrimPermit ||
				b.Prim != PrimPermit && a.Prim != PrimWrite && b.Prim != PrimWrite {
				continue // a hold the rule does not count against b: a reader with a reader
			}
			if h.lostData(a, ends[j], b) {
				excused++
				continue
			}
			live = append(live, a)
		}
		if b.Prim == PrimPermit {
			r.PermitChecks++
			r.MaxPermitHolders = max(r.MaxPermitHolders, len(live)+1)
			if len(live)+1 <= h.Permits {
				if len(live)+excused+1 > h.Permits {
					r.PrimDataLoss++
				}
				continue
			}
			r.PermitExcess++
			r.Violations = append(r.Violations, fmt.Sprintf(
				"%d permits of %q live at once (at most %d): %v granted at %s while %d held it\n    %s%s\n    faults around it:%s",
				len(live)+1, b.Name, h.Permits, b, h.rel(b.Grant), len(live), h.describe(b), h.describeAll(live), h.faultsNear(live[0].Grant, b.Grant)))
			continue
		}
		if b.Prim == PrimWrite {
			r.RWChecks++
		}
		if excused > 0 && len(live) == 0 {
			r.PrimDataLoss++
		}
		for _, a := range live {
			r.RWOverlaps++
			r.Violations = append(r.Violations, fmt.Sprintf(
				"read-write overlap on %q: %v granted at %s while %v held it\n    %s\n    %s\n    faults around it:%s",
				b.Name, b, h.rel(b.Grant), a, h.describe(a), h.describe(b), h.faultsNear(a.Grant, b.Grant)))
		}
	}
}

// describeAll renders each of acqs, one after the other.
func (h *History) describeAll(acqs []*Acquisition) string {
	var b strings.Builder
	for _, a := range acqs {
		b.WriteString("\n    " + h.describe(a))
	}
	return b.String()
}

// checkFenceOrder checks property 7 on the grants of one primitive's name, in grant order: a
// grant's fence is above the fence of every grant whose reply came back before its call began
// — fences increase with every grant, as a holder that compares them may rely on. Grants whose
// calls overlapped may come back in either order.
func (h *History) checkFenceOrder(r *Report, acqs []*Acquisition) {
	highest := make([]uint64, len(acqs)) // highest[i]: the highest fence of acqs[:i+1]
	var high uint64
	for i, a := range acqs {
		high = max(high, a.Fence)
		highest[i] = high
	}
	for _, b := range acqs {
		// The grants that came back before b's call began: acqs[:n].
		n, _ := slices.BinarySearchFunc(acqs, b.Start, func(a *Acquisition, t int64) int { return cmp.Compare(a.Grant, t) })
		if n == 0 || b.Fence > highest[n-1] {
			continue
		}
		var prev *Acquisition
		for _, a := range acqs[:n] {
			if a.Fence >= b.Fence {
				prev = a
				break
			}
		}
		if h.lostData(prev, b.Start, b) {
			r.PrimDataLoss++
			continue
		}
		r.FenceDisorders++
		r.Violations = append(r.Violations, fmt.Sprintf(
			"fence %d of %v, asked for at %s, is not above fence %d granted at %s\n    %s\n    %s",
			b.Fence, b, h.rel(b.Start), prev.Fence, h.rel(prev.Grant), h.describe(prev), h.describe(b)))
	}
}

// checkWindows checks properties 1 and 4 on the acquisitions of one name, in grant order.
//
// Property 1: the window of each acquisition is [Grant, WindowEnd); two windows of one name
// must not intersect.
//
// Property 4 is read from the same history: a server grants a name only once the previous
// holder's lease is over (released, or run out), so the next grant of the name after A —
// the reply its holder received — comes after A's server-side lease ended. A's context was
// therefore still live past its server-side lease exactly when A's window ends after that
// next grant. Property 1 counts pairs; property 4 counts holders.
func (h *History) checkWindows(r *Report, acqs []*Acquisition) {
	ends := make([]int64, len(acqs))
	hows := make([]string, len(acqs))
	for i, a := range acqs {
		ends[i], hows[i] = h.WindowEnd(a)
	}
	empty := func(i int) bool { return ends[i] <= acqs[i].Grant } // a lock that was never trusted
	for i, a := range acqs {
		if empty(i) {
			continue
		}
		for j := i + 1; j < len(acqs) && acqs[j].Grant < ends[i]; j++ {
			b := acqs[j]
			if empty(j) {
				continue
			}
			if h.lostData(a, ends[i], b) {
				r.DataLossOverlaps++
				continue
			}
			r.Overlaps++
			r.Violations = append(r.Violations, fmt.Sprintf(
				"overlap on %q: the window of %v (ended by %s at %s) was still open when %v was granted at %s, %v earlier\n    %s\n    %s\n    faults around it:%s",
				a.Name, a, hows[i], h.rel(ends[i]), b, h.rel(b.Grant), time.Duration(ends[i]-b.Grant),
				h.describe(a), h.describe(b), h.faultsNear(a.Grant, ends[i])))
		}
		if i+1 < len(acqs) {
			next := acqs[i+1]
			if next.Grant < ends[i] && !h.lostData(a, ends[i], next) {
				r.Outlived++
				if empty(i + 1) { // not reported as an overlap above
					r.Violations = append(r.Violations, fmt.Sprintf(
						"lease outlived on %q: %v still trusted its lock (until %s, by %s) when %v was granted at %s\n    %s\n    %s",
						a.Name, a, h.rel(ends[i]), hows[i], next, h.rel(next.Grant), h.describe(a), h.describe(next)))
				}
			}
		}
	}
}

// lostData reports whether the overlap of a and b (b granted after a, by their replies) is the
// documented effect of data loss: a wipe of their name that lost one of the two grants.
//
//   - a's: the wipe began while a held the lock and before b was granted. "While a held the
//     lock" starts when a's call began, not when its reply came back: the server may grant a,
//     be killed, and the reply reach a's client after the crash began (the wipe then lost the
//     grant as surely as one answered earlier). A wipe that began before a's call cannot have
//     lost a's grant: the server was down until the wipe was over.
//   - b's: b's call began before the wipe and its reply came after the wipe began, while a's
//     call began after it. The server that was wiped may have granted b, its reply held up on
//     the way (a delayed reply) until after a was granted by the restarted server.
func (h *History) lostData(a *Acquisition, aEnd int64, b *Acquisition) bool {
	for _, w := range h.Wipes {
		if !w.affects(a.Name) {
			continue
		}
		if w.From >= a.Start && w.From < aEnd && w.From < b.Grant {
			return true
		}
		if b.Start <= w.From && w.From < b.Grant && a.Start >= w.From {
			return true
		}
	}
	return false
}

// checkLinearizable checks property 2 with porcupine, one name at a time.
func (h *History) checkLinearizable(r *Report, names []string, acqs []*Acquisition, dir string) {
	var bad []string
	unknown := false
	for _, name := range names {
		ops := h.operations(name, acqs)
		res, info := porcupine.CheckOperationsVerbose(lockModel, ops, porcupineTimeout)
		switch res {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			unknown = true
			r.Problems = append(r.Problems, fmt.Sprintf("porcupine timed out on %q (%d operations)", name, len(ops)))
			continue
		}
		bad = append(bad, name)
		msg := fmt.Sprintf("the history of %q is not linearizable against a lock with fences (%d operations)", name, len(ops))
		if dir != "" {
			path := fmt.Sprintf("%s/porcupine-%s.html", dir, safeFileName(name))
			if err := porcupine.VisualizePath(lockModel, info, path); err == nil {
				msg += "; timeline: " + path
			}
		}
		r.Violations = append(r.Violations, msg+h.linearizationHint(name, acqs))
	}
	switch {
	case len(bad) > 0:
		r.Linearizable = "illegal on " + strings.Join(bad, ", ")
	case unknown:
		r.Linearizable = "unknown (timed out)"
	default:
		r.Linearizable = "ok"
	}
}

// linearizationHint points at the likeliest cause of a non-linearizable history: a fence that
// did not increase from one grant to the next in grant order.
func (h *History) linearizationHint(name string, acqs []*Acquisition) string {
	var prev *Acquisition
	for _, a := range acqs {
		if a.Name != name {
			continue
		}
		if prev != nil && a.Fence <= prev.Fence {
			return fmt.Sprintf("\n    fence %d granted at %s after fence %d granted at %s:\n    %s\n    %s",
				a.Fence, h.rel(a.Grant), prev.Fence, h.rel(prev.Grant), h.describe(prev), h.describe(a))
		}
		prev = a
	}
	return ""
}

// checkWrites checks property 3 on the Resource's log, and cross-checks it with the workers'
// records of their writes.
//
// A write is stale when its fence is below a fence the Resource accepted before it arrived.
// The Resource must reject exactly those: an accepted stale write would break fence order,
// a rejected fresh one would be a harness defect. Replaying the log in arrival order
// verifies both, independently of the Resource's own bookkeeping.
func (h *History) checkWrites(r *Report, acqs []*Acquisition) {
	byToken := make(map[string]*Acquisition, len(acqs))
	for _, a := range acqs {
		byToken[a.Token] = a
	}
	high := map[string]uint64{} // per name: the highest fence accepted so far
	logged := map[string]Write{}
	for _, w := range h.Writes {
		key := fmt.Sprintf("%s/%d", w.Token, w.Seq)
		if _, dup := logged[key]; dup {
			r.Problems = append(r.Problems, fmt.Sprintf("write %s logged twice: writes must be numbered once per lock", key))
		}
		logged[key] = w
		stale := w.Fence < high[w.Name]
		switch {
		case w.Accepted && stale:
			r.StaleAccepted++
			r.Violations = append(r.Violations, fmt.Sprintf(
				"stale write accepted on %q: fence %d at %s after fence %d was accepted", w.Name, w.Fence, h.rel(w.Arrival), high[w.Name]))
		case !w.Accepted && stale:
			r.StaleRejected++
		case !w.Accepted:
			r.Problems = append(r.Problems, fmt.Sprintf(
				"the resource rejected a write of fence %d on %q at %s that was not stale (highest %d)", w.Fence, w.Name, h.rel(w.Arrival), high[w.Name]))
		}
		if w.Accepted {
			r.WritesAccepted++
			high[w.Name] = w.Fence
		}
		if a := byToken[w.Token]; a != nil && (a.Fence != w.Fence || a.Name != w.Name) {
			r.Problems = append(r.Problems, fmt.Sprintf(
				"write %s/%d carries fence %d on %q, but its acquisition got fence %d on %q", w.Token, w.Seq, w.Fence, w.Name, a.Fence, a.Name))
		}
	}
	for _, e := range h.Events {
		switch e.Kind {
		case EvWrite:
			a := byToken[e.Token]
			if a == nil {
				r.Problems = append(r.Problems, fmt.Sprintf("write of token %s without a grant", e.Token))
				continue
			}
			if end, _ := h.WindowEnd(a); e.At >= end {
				r.LateWrites++
				if w, ok := logged[fmt.Sprintf("%s/%d", e.Token, e.Seq)]; ok && w.Accepted {
					r.LateAccepted++
				}
			}
		case EvWrote:
			w, ok := logged[fmt.Sprintf("%s/%d", e.Token, e.Seq)]
			switch {
			case e.Outcome == "error":
				// The worker did not learn the outcome (a timeout): nothing to compare.
			case !ok:
				r.Problems = append(r.Problems, fmt.Sprintf("worker saw write %s/%d %s, the resource never logged it", e.Token, e.Seq, e.Outcome))
			case (e.Outcome == "accepted") != w.Accepted:
				r.Problems = append(r.Problems, fmt.Sprintf("worker saw write %s/%d %s, the resource logged accepted=%v", e.Token, e.Seq, e.Outcome, w.Accepted))
			}
		}
	}
}

// cancelLag records how long after its own deadline a lock's context ended, for the locks
// whose context the Guard ended because the deadline came (not released, killed or stopped).
func (h *History) cancelLag(r *Report, acqs []*Acquisition) {
	for _, a := range acqs {
		end, how := h.WindowEnd(a)
		if how != "ctx" || a.Deadline == 0 || end <= a.Deadline {
			continue
		}
		r.MaxCancelLag = max(r.MaxCancelLag, time.Duration(end-a.Deadline))
	}
}

// safeFileName keeps letters, digits, '-' and '_' of s.
func safeFileName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, s)
}
