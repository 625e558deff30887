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
		"linearizable: %s, max cancel lag %v, seed %d",
		r.Backend, r.Acquisitions, sum(r.Calls), sum(r.Faults), formatCounts(r.Faults),
		r.Overlaps, r.DataLossOverlaps, r.StaleAccepted, r.StaleRejected, r.WritesAccepted,
		r.LateWrites, r.Outlived, r.Linearizable, r.MaxCancelLag.Round(time.Microsecond), r.Seed)
}

// Details are the figures Summary leaves out, in one line.
func (r *Report) Details() string {
	return fmt.Sprintf("%s: %v of chaos, %d worker processes (respawns included), acquire calls %s, "+
		"writes sent late %d (accepted before a newer holder wrote: %d), history %s (kept with go test -artifacts)",
		r.Backend, r.Duration.Round(time.Millisecond), r.Workers, formatCounts(r.Calls),
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
	acqs, calls, problems := h.Acquisitions()
	r.Calls, r.Acquisitions = calls, len(acqs)
	r.Problems = append(r.Problems, problems...)

	byName := map[string][]*Acquisition{}
	for _, a := range acqs {
		byName[a.Name] = append(byName[a.Name], a)
	}
	names := slices.Sorted(maps.Keys(byName))
	for _, name := range names {
		h.checkWindows(r, byName[name])
	}
	h.checkLinearizable(r, names, acqs, dir)
	h.checkWrites(r, acqs)
	h.cancelLag(r, acqs)
	return r
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

// lostData reports whether a wipe of a's name happened while a held the lock and before b
// was granted: the overlap of a and b is then the documented effect of data loss.
func (h *History) lostData(a *Acquisition, aEnd int64, b *Acquisition) bool {
	for _, w := range h.Wipes {
		if w.affects(a.Name) && w.From >= a.Grant && w.From < aEnd && w.From < b.Grant {
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
