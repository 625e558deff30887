package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/guardlock/guard"
)

// kind tells events apart.
type kind int

const (
	jobRun   kind = iota // an instance held the job's lock and ran the report
	taskRun              // an instance held a task's lock and ran the task
	busyJob              // an instance fired the report and found the window taken
	busyTask             // an instance found a task's lock held, and skipped the task
)

// event is a run under a lock, or an attempt that found the lock busy (start only).
type event struct {
	instance   int
	kind       kind
	key        int    // the window, or the task ID
	fence      uint64 // runs only
	start, end time.Time
}

// record is what a demo run did. It is safe for concurrent use.
type record struct {
	cfg   config
	epoch time.Time // the start of window 0
	log   *slog.Logger

	mu     sync.Mutex // protects events and errs
	events []event
	errs   []error
}

func (r *record) add(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// ran records a run under l that ends now.
func (r *record) ran(instance int, k kind, key int, l *guard.Lock) {
	r.add(event{instance: instance, kind: k, key: key, fence: l.Fence(), start: l.AcquiredAt(), end: time.Now()})
}

func (r *record) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

// window returns the window that t falls in.
func (r *record) window(t time.Time) int { return int(t.Sub(r.epoch) / r.cfg.window) }

// snapshot returns the events, ordered by start, and the errors.
func (r *record) snapshot() ([]event, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	events := slices.Clone(r.events)
	slices.SortStableFunc(events, func(a, b event) int { return a.start.Compare(b.start) })
	return events, slices.Clone(r.errs)
}

// runs returns the runs of kind k by key.
func runs(events []event, k kind) map[int][]event {
	m := map[int][]event{}
	for _, e := range events {
		if e.kind == k {
			m[e.key] = append(m[e.key], e)
		}
	}
	return m
}

// check returns an error unless no window and no task ran more than once and, when complete,
// every window and every task of the run ran.
func (r *record) check(complete bool) error {
	events, errs := r.snapshot()
	jobs, tasks := runs(events, jobRun), runs(events, taskRun)
	for _, c := range []struct {
		what string
		runs map[int][]event
		want int // keys 0 … want-1 must all have run when complete
	}{
		{"window", jobs, r.cfg.windows},
		{"task", tasks, r.cfg.tasks},
	} {
		for _, key := range slices.Sorted(maps.Keys(c.runs)) {
			if n := len(c.runs[key]); n > 1 {
				errs = append(errs, fmt.Errorf("%s %d ran %d times", c.what, key, n))
			}
		}
		for key := range c.want {
			if _, ok := c.runs[key]; complete && !ok {
				errs = append(errs, fmt.Errorf("%s %d did not run", c.what, key))
			}
		}
	}
	return errors.Join(errs...)
}

// summarize prints what ran: which instance ran each window and each task, and how often
// the others found the lock busy.
func (r *record) summarize(w io.Writer, backend string) {
	events, _ := r.snapshot()
	jobs, tasks := runs(events, jobRun), runs(events, taskRun)
	busy := map[kind]map[int]int{busyJob: {}, busyTask: {}} // by kind and key
	perInstance := map[int]map[kind]int{}
	for _, e := range events {
		if busy[e.kind] != nil {
			busy[e.kind][e.key]++
		}
		if perInstance[e.instance] == nil {
			perInstance[e.instance] = map[kind]int{}
		}
		perInstance[e.instance][e.kind]++
	}

	fmt.Fprintf(w, "%d instances on %s; %d tasks; job every %v\n\n", r.cfg.instances, backend, r.cfg.tasks, r.cfg.window)
	fmt.Fprintf(w, "job %q on gocron, gocronlock.Locker with guard.MinHold(%v): every instance fires it at every tick\n",
		jobName, r.cfg.minHold())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\truns\tran by\tfence\tstarted\tfound busy\t")
	for _, k := range slices.Sorted(maps.Keys(jobs)) {
		e := jobs[k][0]
		fmt.Fprintf(tw, "%d\t%d\tinstance %d\t%d\t+%dms\t%d\t\n", k, len(jobs[k]), e.instance, e.fence,
			e.start.Sub(r.epoch).Milliseconds(), busy[busyJob][k])
	}
	tw.Flush()

	fmt.Fprintf(w, "\ntasks %q: every instance walks the whole batch, skipping busy and done tasks\n", taskTemplate)
	ids := slices.Sorted(maps.Keys(tasks))
	for len(ids) > 0 {
		row := ids[:min(len(ids), 24)]
		ids = ids[len(row):]
		line := func(label string, cell func(id int) string) {
			var b strings.Builder
			fmt.Fprintf(&b, "%-9s", label)
			for _, id := range row {
				fmt.Fprintf(&b, "%3s", cell(id))
			}
			fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		}
		line("task", func(id int) string { return fmt.Sprint(id) })
		line("runs", func(id int) string { return fmt.Sprint(len(tasks[id])) })
		line("ran by", func(id int) string { return fmt.Sprint(tasks[id][0].instance) })
		line("busy", func(id int) string { return fmt.Sprint(busy[busyTask][id]) })
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\twindows run\ttasks run\tjob found busy\ttasks found busy\t")
	for _, id := range slices.Sorted(maps.Keys(perInstance)) {
		n := perInstance[id]
		fmt.Fprintf(tw, "instance %d\t%d\t%d\t%d\t%d\t\n", id, n[jobRun], n[taskRun], n[busyJob], n[busyTask])
	}
	tw.Flush()
}
