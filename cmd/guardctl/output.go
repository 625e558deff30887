package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/guardlock/guard"
)

// lockJSON is the -json form of a guard.LockInfo: list prints an array of them, show and
// release one, watch one array per line.
type lockJSON struct {
	Name        string    `json:"name"`
	Held        bool      `json:"held"`
	Kept        bool      `json:"kept"`
	Fence       uint64    `json:"fence"`
	Instance    string    `json:"instance"`
	Label       string    `json:"label"`
	AcquiredAt  time.Time `json:"acquired_at,omitzero"`
	RemainingMS int64     `json:"remaining_ms"`
	Waiting     int       `json:"waiting"`
}

func toJSON(info guard.LockInfo) lockJSON {
	return lockJSON{
		Name: info.Name, Held: info.Held, Kept: info.Kept, Fence: info.Fence,
		Instance: info.Instance, Label: info.Label, AcquiredAt: info.AcquiredAt,
		RemainingMS: info.Remaining.Milliseconds(), Waiting: info.Waiting,
	}
}

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// locksJSON returns locks in their -json form: an empty array, never null, when there are
// none.
func locksJSON(locks []guard.LockInfo) []lockJSON {
	out := make([]lockJSON, len(locks))
	for i, l := range locks {
		out[i] = toJSON(l)
	}
	return out
}

// tableHeader is the header row of the lock table.
const tableHeader = "NAME\tHELD\tKEPT\tFENCE\tINSTANCE\tLABEL\tACQUIRED\tREMAINING\tWAITING"

// writeTable writes locks as a table aligned with tabwriter, times in loc.
func writeTable(w io.Writer, locks []guard.LockInfo, loc *time.Location) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, tableHeader)
	for _, l := range locks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\n",
			text(l.Name), yesNo(l.Held), yesNo(l.Kept), l.Fence, text(l.Instance), text(l.Label),
			timestamp(l.AcquiredAt, loc, time.RFC3339), duration(l.Remaining), l.Waiting)
	}
	return tw.Flush()
}

// writeLock writes what show prints of one lock: a field per line. For a free name it gives
// the last holder's fields the backend still has. now is for the age of the acquisition.
func writeLock(w io.Writer, l guard.LockInfo, now time.Time, loc *time.Location) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	field := func(key, value string) { fmt.Fprintf(tw, "%s\t%s\n", key, value) }
	field("NAME", text(l.Name))
	acquired := ""
	if !l.AcquiredAt.IsZero() {
		acquired = timestamp(l.AcquiredAt, loc, "2006-01-02T15:04:05.000Z07:00")
		if age := now.Sub(l.AcquiredAt); age > 0 {
			acquired += " (" + duration(age) + " ago)"
		}
	}
	if !l.Held {
		field("STATE", "free")
		if l.Fence == 0 {
			field("LAST FENCE", "unknown")
		} else {
			field("LAST FENCE", strconv.FormatUint(l.Fence, 10))
		}
		if l.Instance != "" {
			field("LAST INSTANCE", text(l.Instance))
		}
		if l.Label != "" {
			field("LAST LABEL", text(l.Label))
		}
		if acquired != "" {
			field("LAST ACQUIRED", acquired)
		}
		if l.Waiting > 0 {
			field("WAITING", strconv.Itoa(l.Waiting))
		}
		return tw.Flush()
	}
	state := "held"
	if l.Kept {
		state = "kept: released, but taken until its MinHold window ends"
	}
	field("STATE", state)
	field("FENCE", strconv.FormatUint(l.Fence, 10))
	field("INSTANCE", text(l.Instance))
	field("LABEL", text(l.Label))
	field("ACQUIRED", text(acquired))
	field("REMAINING", duration(l.Remaining))
	field("WAITING", strconv.Itoa(l.Waiting))
	return tw.Flush()
}

// describe says in one line which lock l is and who holds it, for the confirmation of a
// release and its report.
func describe(l guard.LockInfo) string { return text(l.Name) + ", " + holder(l) }

// holder says in a few words who holds l: "held by worker-1 (label job), fence 7, 20s left".
func holder(l guard.LockInfo) string {
	var b strings.Builder
	if l.Kept {
		b.WriteString("kept for its MinHold window")
	} else {
		fmt.Fprintf(&b, "held by %s", text(l.Instance))
	}
	if l.Label != "" {
		fmt.Fprintf(&b, " (label %s)", text(l.Label))
	}
	fmt.Fprintf(&b, ", fence %d, %s left", l.Fence, duration(l.Remaining))
	if l.Waiting > 0 {
		fmt.Fprintf(&b, ", %d waiting", l.Waiting)
	}
	return b.String()
}

// text returns s for a table cell: "-" when empty, quoted when it holds a byte that would
// break the layout or the terminal (a tab, a newline, an escape sequence) or is not UTF-8
// (0xff is tabwriter's escape, which would swallow the cells after it).
func text(s string) string {
	if s == "" {
		return "-"
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// timestamp formats t in loc with layout, or "-" for the zero time.
func timestamp(t time.Time, loc *time.Location, layout string) string {
	if t.IsZero() {
		return "-"
	}
	return t.In(loc).Format(layout)
}

// duration formats d for people: milliseconds under a second, tenths of a second under a
// minute, whole seconds above; "-" for none.
func duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
