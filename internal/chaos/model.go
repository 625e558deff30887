package chaos

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/guardlock/guard/watchdog"
)

// Why a linearizability checker, and why porcupine.
//
// The overlap check (Check, property 1) compares validity windows pairwise. It cannot say
// whether fences were handed out in the order the server granted the lock, because the
// server's order of two acquire calls that were out at the same time is not in the history:
// either may have been granted first. A linearizability checker answers exactly that
// question: is there one order of all the operations of a name — consistent with real time
// (an operation that returned before another was called comes first) — in which a sequential
// lock with fences, the specification below, accepts every operation with the outcome that
// was observed? That covers, in one verdict, a double grant, a grant while the previous holder
// still trusted its lock, and a fence that goes backwards or repeats (after a restart that
// lost the counter, say), without us choosing an order for concurrent calls by hand.
//
// porcupine (github.com/anishathalye/porcupine) is a small, dependency-free Go implementation
// of the Wing & Gong / Lowe algorithm with P-compositionality, used for the linearizability
// tests of MIT 6.5840 and etcd's robustness tests. It takes operations with call and return
// times — which is what the workers record — and a model as plain Go functions; it renders a
// failing history as an HTML timeline. The alternatives are heavier for no gain here: Knossos
// and Elle are Clojure (Jepsen), and a hand-written search would be a second thing to trust.
// Histories are checked per lock name (names are independent, so each partition is small).

// The operations of the lock model.
const (
	opAcquire = iota // a grant: output is its fence
	opEnd            // the holder of a fence stops holding the lock on the server
	opWipe           // the server lost its data: whoever held the lock holds it no more
)

// lockInput is the input of one operation of the model.
type lockInput struct {
	op    int
	fence uint64 // opEnd: the fence of the holder that ends
	who   string // for the visualization: the acquisition
}

// lockState is the state of one lock name: who holds it, the last fence given, and the
// holders whose lock a wipe took (their ends are still to come, and are no-ops).
type lockState struct {
	held    bool
	holder  uint64
	last    uint64
	orphans string // sorted fences, comma-separated: comparable with ==
}

// lockModel is a sequential lock with fences:
//
//   - Acquire() → f is legal only when the lock is free and f > the last fence given: the
//     lock is then held by f.
//   - End(f) — a release that took effect, or the lease running out — is legal only when f
//     holds the lock: it is then free. (Or when a wipe orphaned f: nothing changes.)
//   - Wipe — the server restarted without its data — frees the lock and keeps the last fence:
//     guard promises that fences survive data loss (a floor on the server's clock), not the
//     lock itself (docs/semantics.md, "Data loss on the backend").
var lockModel = porcupine.Model{
	Init: func() any { return lockState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in := state.(lockState), input.(lockInput)
		switch in.op {
		case opAcquire:
			f := output.(uint64)
			if s.held || f <= s.last {
				return false, s
			}
			s.held, s.holder, s.last = true, f, f
			return true, s
		case opEnd:
			if s.held && s.holder == in.fence {
				s.held, s.holder = false, 0
				return true, s
			}
			if o, ok := removeOrphan(s.orphans, in.fence); ok {
				s.orphans = o
				return true, s
			}
			return false, s
		case opWipe:
			if s.held {
				s.orphans = addOrphan(s.orphans, s.holder)
				s.held, s.holder = false, 0
			}
			return true, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in := input.(lockInput)
		switch in.op {
		case opAcquire:
			return fmt.Sprintf("Acquire() → %d [%s]", output, in.who)
		case opEnd:
			return fmt.Sprintf("End(%d) [%s]", in.fence, in.who)
		default:
			return "Wipe()"
		}
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		h := "free"
		if s.held {
			h = fmt.Sprintf("held by %d", s.holder)
		}
		if s.orphans != "" {
			h += ", orphans " + s.orphans
		}
		return fmt.Sprintf("%s, last fence %d", h, s.last)
	},
}

func addOrphan(list string, f uint64) string {
	var fs []uint64
	if list != "" {
		for _, s := range strings.Split(list, ",") {
			n, _ := strconv.ParseUint(s, 10, 64)
			fs = append(fs, n)
		}
	}
	fs = append(fs, f)
	slices.Sort(fs)
	parts := make([]string, len(fs))
	for i, n := range fs {
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, ",")
}

func removeOrphan(list string, f uint64) (string, bool) {
	if list == "" {
		return list, false
	}
	parts := strings.Split(list, ",")
	want := strconv.FormatUint(f, 10)
	i := slices.Index(parts, want)
	if i < 0 {
		return list, false
	}
	return strings.Join(slices.Delete(parts, i, i+1), ","), true
}

// endSlack bounds how long after a holder's window ended the server may still hold its lock,
// beyond one lease: a renewal that was on the wire (behind injected latency or a delayed
// reply) may still have been applied. It only sets the Return of End operations, which
// nothing in the model depends on being tight.
const endSlack = 10 * time.Second

// operations returns the model operations of one name: each acquisition's Acquire and End,
// and the wipes that lost the name's data.
//
// Acquire is called when the attempt that was granted was sent — derived from the deadline
// at the grant, which is that moment plus TTL minus drift (watchdog.Deadline), and kept
// within the acquire call — and returns when the grant's reply came back. End is called when
// the holder's validity window ends: the server must not let the lock go before the holder
// stopped trusting it (property 4), so End cannot be placed earlier. It returns when
// Release's reply came back, for a release that freed the lock; otherwise within a lease
// (plus endSlack) of the window's end, when the server's lease ran out.
func (h *History) operations(name string, acqs []*Acquisition) []porcupine.Operation {
	var ops []porcupine.Operation
	clients := map[string]int{}
	client := func(a *Acquisition) int {
		k := fmt.Sprintf("%d.%d", a.Worker, a.Inc)
		if _, ok := clients[k]; !ok {
			clients[k] = len(clients)
		}
		return clients[k]
	}
	for _, a := range acqs {
		if a.Name != name {
			continue
		}
		call := a.Start
		if a.FirstDeadline != 0 {
			sent := a.FirstDeadline - int64(a.TTL-watchdog.Drift(a.TTL))
			if sent >= a.Start && sent <= a.Grant {
				call = sent
			}
		}
		c := client(a)
		ops = append(ops, porcupine.Operation{
			ClientId: c, Input: lockInput{op: opAcquire, who: a.String()},
			Call: call, Output: a.Fence, Return: a.Grant,
		})
		end, _ := h.WindowEnd(a)
		end = max(end, a.Grant)
		ret := end + int64(a.TTL+endSlack)
		if a.ReleaseDone != 0 && a.ReleaseErr == "" && a.ReleaseDone >= end {
			ret = a.ReleaseDone
		}
		ops = append(ops, porcupine.Operation{
			ClientId: c, Input: lockInput{op: opEnd, fence: a.Fence, who: a.String()},
			Call: end, Return: ret,
		})
	}
	for _, w := range h.Wipes {
		if w.affects(name) {
			ops = append(ops, porcupine.Operation{
				ClientId: len(clients), Input: lockInput{op: opWipe, who: "server"},
				Call: w.From, Return: w.To,
			})
		}
	}
	return ops
}
