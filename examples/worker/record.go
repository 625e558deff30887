package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// outcome is what a run did, as the journal tells it: the events of every process, and what
// the verdict covers.
type outcome struct {
	run    runRecord
	events []event // ordered by start
	// windows and tasks are what the verdict covers: windows[0] ≤ k < windows[1], and the
	// same for task IDs. A run with an end covers all of its windows and its batch; one
	// without, the windows this process took part in and their batches.
	windows, tasks [2]int64
	// failed holds the windows (jobRun) and tasks (taskRun) whose run met an error in this
	// process: when one did not run, the error says why, and check does not blame the locks.
	failed map[kind]map[int64]bool
}

// newOutcome returns the outcome of r from its events, covering windows from ≤ k < to.
func newOutcome(r runRecord, events []event, from, to int64) outcome {
	events = slices.Clone(events)
	slices.SortStableFunc(events, func(a, b event) int { return a.Start.Compare(b.Start) })
	// An event recorded twice — a write that the client sent again after its answer was lost
	// — is one event, not a second run.
	events = slices.CompactFunc(events, func(a, b event) bool {
		return a.Instance == b.Instance && a.Kind == b.Kind && a.Key == b.Key && a.Fence == b.Fence &&
			a.Start.Equal(b.Start) && a.End.Equal(b.End)
	})
	o := outcome{run: r, events: events, windows: [2]int64{from, to}, tasks: [2]int64{0, int64(r.Tasks)}}
	if r.Windows == 0 {
		o.tasks = [2]int64{from * int64(r.Tasks), to * int64(r.Tasks)}
	}
	return o
}

// covers reports whether the verdict covers the event.
func (o outcome) covers(e event) bool {
	span := o.tasks
	if e.Kind == jobRun || e.Kind == busyJob || e.Kind == maintenance {
		span = o.windows
	}
	return span[0] <= e.Key && e.Key < span[1]
}

// runs returns the runs of kind k that the verdict covers, by key.
func (o outcome) runs(k kind) map[int64][]event {
	m := map[int64][]event{}
	for _, e := range o.events {
		if e.Kind == k && o.covers(e) {
			m[e.Key] = append(m[e.Key], e)
		}
	}
	return m
}

// What check can find wrong with a run, each a guarantee of one of the locks; the verdict
// names those that failed. Each of check's errors matches one (errors.Is).
var (
	errRanTwice   = errors.New("a window or a task ran more than once")
	errDidNotRun  = errors.New("a window or a task did not run")
	errOverrun    = errors.New("a tenant ran more imports at once than its permits")
	errTwoLeaders = errors.New("two leaders ran maintenance at once")
)

// failure is one of check's errors (made by breach): its message, and which guarantee it broke.
type failure struct {
	broke error
	msg   string
}

func (f failure) Error() string { return f.msg }
func (f failure) Unwrap() error { return f.broke }

func breach(broke error, format string, args ...any) error {
	return failure{broke: broke, msg: fmt.Sprintf(format, args...)}
}

// broken returns what err, from check, says failed: the guarantees it broke, in check's order.
func broken(err error) string {
	var what []string
	for _, g := range []error{errRanTwice, errDidNotRun, errOverrun, errTwoLeaders} {
		if errors.Is(err, g) {
			what = append(what, g.Error())
		}
	}
	return strings.Join(what, "; ")
}

// describe tells the runs of one window or task apart: who ran each, when after its window
// started (a task: after the run's first window started), and under which fence — what
// separates a lock that failed (a second run inside the first one's hold) from a scheduler
// that fired later than the hold (docs/scheduling.md).
func (o outcome) describe(runs []event) string {
	parts := make([]string, len(runs))
	for i, e := range runs {
		from := o.run.start(0)
		if e.Kind == jobRun {
			from = o.run.start(e.Key)
		}
		parts[i] = fmt.Sprintf("instance %s at %+dms, fence %d", e.Instance, e.Start.Sub(from).Milliseconds(), e.Fence)
	}
	return strings.Join(parts, "; ")
}

// check returns an error unless no window and no task ran more than once and, when complete,
// every window and every task ran — but for those whose run met an error in this process
// (o.failed), which the process reports as its own errors. A done record that the journal
// refused (staleTask) is not a run.
func (o outcome) check(complete bool) error {
	var errs []error
	for _, c := range []struct {
		what string
		runs map[int64][]event
		span [2]int64
	}{
		{"window", o.runs(jobRun), o.windows},
		{"task", o.runs(taskRun), o.tasks},
	} {
		for _, key := range slices.Sorted(maps.Keys(c.runs)) {
			if n := len(c.runs[key]); n > 1 {
				errs = append(errs, breach(errRanTwice, "%s %d ran %d times (%s)", c.what, key, n, o.describe(c.runs[key])))
			}
		}
		k := jobRun
		if c.what == "task" {
			k = taskRun
		}
		for key := c.span[0]; complete && key < c.span[1]; key++ {
			if _, ok := c.runs[key]; !ok && !o.failed[k][key] {
				errs = append(errs, breach(errDidNotRun, "%s %d did not run", c.what, key))
			}
		}
	}
	for _, tenant := range slices.Sorted(maps.Keys(o.importsAtOnce())) {
		if n := o.importsAtOnce()[tenant]; o.run.Imports > 0 && n > o.run.Imports {
			errs = append(errs, breach(errOverrun, "tenant %d ran %d imports at once, more than its %d permits", tenant, n, o.run.Imports))
		}
	}
	if err := o.checkTerms(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// importsAtOnce returns, per tenant, the most tasks that ran at once: the tasks' runs from
// when they got their import permit to when they were recorded done.
func (o outcome) importsAtOnce() map[int64]int {
	type edge struct {
		at    time.Time
		delta int
	}
	edges := map[int64][]edge{}
	for _, e := range o.events {
		if e.Kind == taskRun && o.covers(e) {
			t := o.run.tenant(e.Key)
			edges[t] = append(edges[t], edge{e.Start, 1}, edge{e.End, -1})
		}
	}
	most := map[int64]int{}
	for t, es := range edges {
		// An end before a start at one instant: a permit released and taken at once.
		slices.SortFunc(es, func(a, b edge) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.delta, b.delta)) })
		n := 0
		for _, e := range es {
			n += e.delta
			most[t] = max(most[t], n)
		}
	}
	return most
}

// checkTerms returns an error when a round of maintenance came after a round of a newer
// term: two leaders at once.
func (o outcome) checkTerms() error {
	var newest event
	for _, e := range o.events { // by start
		if e.Kind != maintenance {
			continue
		}
		if e.Fence < newest.Fence {
			return breach(errTwoLeaders, "maintenance: instance %s ran a round with term fence %d after instance %s ran one with fence %d: two leaders at once",
				e.Instance, e.Fence, newest.Instance, newest.Fence)
		}
		newest = e
	}
	return nil
}

// instances returns the instances that appear in the events, by process ID and then by
// number, and a number for each, from 1: how the summary and the timeline name them.
func (o outcome) instances() ([]string, map[string]int) {
	seen := map[string]bool{}
	for _, e := range o.events {
		seen[e.Instance] = true
	}
	names := slices.SortedFunc(maps.Keys(seen), func(a, b string) int {
		pa, na := splitInstance(a)
		pb, nb := splitInstance(b)
		return cmp.Or(cmp.Compare(pa, pb), cmp.Compare(na, nb), strings.Compare(a, b))
	})
	number := make(map[string]int, len(names))
	for i, name := range names {
		number[name] = i + 1
	}
	return names, number
}

// splitInstance returns the process ID and the number of the instance "pid/n".
func splitInstance(name string) (pid, n int) {
	p, i, _ := strings.Cut(name, "/")
	pid, _ = strconv.Atoi(p)
	n, _ = strconv.Atoi(i)
	return pid, n
}

// processes describes which instances run in which process, "instances 1–3: process 4242
// (this one)", one line per process.
func (o outcome) processes(self int) []string {
	names, number := o.instances()
	var lines []string
	for i := 0; i < len(names); {
		pid, _ := splitInstance(names[i])
		j := i
		for j < len(names) {
			if p, _ := splitInstance(names[j]); p != pid {
				break
			}
			j++
		}
		which := fmt.Sprintf("instance %d", number[names[i]])
		if j-i > 1 {
			which = fmt.Sprintf("instances %d–%d", number[names[i]], number[names[j-1]])
		}
		line := fmt.Sprintf("%s: process %d", which, pid)
		if pid == self {
			line += " (this one)"
		}
		lines = append(lines, line)
		i = j
	}
	return lines
}

// summarize prints what ran, in every process: which instance ran each window and each
// task, and how often the others found the lock busy.
func (o outcome) summarize(w io.Writer, cfg config, backend string, self int) {
	jobs, tasks := o.runs(jobRun), o.runs(taskRun)
	names, number := o.instances()
	busy := map[kind]map[int64]int{busyJob: {}, busyTask: {}} // by kind and key
	perInstance := map[string]map[kind]int{}
	for _, e := range o.events {
		if !o.covers(e) {
			continue
		}
		if busy[e.Kind] != nil {
			busy[e.Kind][e.Key]++
		}
		if perInstance[e.Instance] == nil {
			perInstance[e.Instance] = map[kind]int{}
		}
		perInstance[e.Instance][e.Kind]++
	}

	fmt.Fprintf(w, "%d instances on %s; %d tasks; job every %v\n", len(names), backend, o.run.Tasks, o.run.Window)
	for _, line := range o.processes(self) {
		fmt.Fprintln(w, "  "+line)
	}
	fmt.Fprintf(w, "\njob %q on gocron, gocronlock.Locker with guard.MinHold(%v): every instance fires it at every tick\n",
		o.run.jobLock(), cfg.minHold())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\truns\tran by\tfence\tstarted\tfound busy\t")
	for _, k := range slices.Sorted(maps.Keys(jobs)) {
		e := jobs[k][0]
		fmt.Fprintf(tw, "%d\t%d\tinstance %d\t%d\t+%dms\t%d\t\n", k, len(jobs[k]), number[e.Instance], e.Fence,
			e.Start.Sub(o.run.start(k)).Milliseconds(), busy[busyJob][k])
	}
	tw.Flush()

	fmt.Fprintf(w, "\ntasks %q: every instance walks the whole batch, skipping busy and done tasks\n", taskTemplate)
	ids := slices.Sorted(maps.Keys(tasks))
	width := 3
	if len(ids) > 0 {
		width = max(width, len(strconv.FormatInt(ids[len(ids)-1], 10))+1, len(strconv.Itoa(len(names)))+1)
	}
	for len(ids) > 0 {
		row := ids[:min(len(ids), 72/width)]
		ids = ids[len(row):]
		line := func(label string, cell func(id int64) string) {
			var b strings.Builder
			fmt.Fprintf(&b, "%-9s", label)
			for _, id := range row {
				fmt.Fprintf(&b, "%*s", width, cell(id))
			}
			fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		}
		line("task", func(id int64) string { return strconv.FormatInt(id, 10) })
		line("runs", func(id int64) string { return strconv.Itoa(len(tasks[id])) })
		line("ran by", func(id int64) string { return strconv.Itoa(number[tasks[id][0].Instance]) })
		line("busy", func(id int64) string { return strconv.Itoa(busy[busyTask][id]) })
	}

	if o.run.Imports > 0 {
		most := o.importsAtOnce()
		var per []string
		for _, t := range slices.Sorted(maps.Keys(most)) {
			per = append(per, fmt.Sprintf("tenant %d: %d", t, most[t]))
		}
		fmt.Fprintf(w, "imports of %d tenants, at most %d of a tenant at once (a guard.Semaphore per tenant, %q); most at once: %s\n",
			o.run.Tenants, o.run.Imports, "imports:"+o.run.ID+":{tenant}", strings.Join(per, ", "))
	}
	var terms []string
	seen := map[uint64]bool{}
	rounds := 0
	for _, e := range o.events {
		if e.Kind == maintenance && o.covers(e) {
			rounds++
			if !seen[e.Fence] {
				seen[e.Fence] = true
				terms = append(terms, fmt.Sprintf("instance %d (fence %d)", number[e.Instance], e.Fence))
			}
		}
	}
	fmt.Fprintf(w, "maintenance, led by the instance elected (guard.Election %q): %d rounds; leaders in turn: %s\n",
		o.run.maintenanceElection(), rounds, strings.Join(terms, ", "))

	if stale := o.runs(staleTask); len(stale) > 0 {
		fmt.Fprintln(w, "\ndone records refused by their fence (an instance lost its lock while it ran the task, which was taken over):")
		for _, id := range slices.Sorted(maps.Keys(stale)) {
			for _, e := range stale[id] {
				fmt.Fprintf(w, "  task %d: instance %d, fence %d; done by instance %d, fence %d\n", id, number[e.Instance], e.Fence,
					number[firstInstance(tasks[id])], firstFence(tasks[id]))
			}
		}
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\twindows run\ttasks run\tjob found busy\ttasks found busy\t")
	for _, name := range names {
		n := perInstance[name]
		fmt.Fprintf(tw, "instance %d\t%d\t%d\t%d\t%d\t\n", number[name], n[jobRun], n[taskRun], n[busyJob], n[busyTask])
	}
	tw.Flush()
}

// firstInstance and firstFence return the instance and the fence of the first of events, or
// "" and 0.
func firstInstance(events []event) string {
	if len(events) == 0 {
		return ""
	}
	return events[0].Instance
}

func firstFence(events []event) uint64 {
	if len(events) == 0 {
		return 0
	}
	return events[0].Fence
}
