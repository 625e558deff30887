package main

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The journal is the state the instances share, kept where the locks are: on the server all
// the processes use (Redis, PostgreSQL, MySQL, MongoDB), or in memory for the embedded backend,
// which is one process. It holds the run the processes take part in, and every event of it:
// each run of the job and of a task, and each time an instance found a lock busy. The
// verdict is read from the journal too, so it covers every process.
//
// A task's done record is fenced, as every write made under a lock must be. Under the task's
// lock an instance first claims the task with its lock's fence, and when the work is done it
// records the task done with the same fence. The journal keeps, per task, the highest fence
// that claimed it, and refuses a done record whose fence is lower, or that comes after the
// task is done: the record of an instance that paused past its lease (a GC pause, a SIGSTOP)
// while another instance took the task over. The lock keeps two instances off one task while
// leases hold; the fence keeps a stale holder's write out when one did not.

// journal is the shared record of runs and their events. Its methods are safe for concurrent
// use.
type journal interface {
	// setup creates what the journal needs on the server (tables, for SQL) when it is
	// missing. Call it under a lock: SQL servers do not like two processes creating one
	// table at once.
	setup(ctx context.Context) error
	// current returns the run recorded last, and false when there is none.
	current(ctx context.Context) (runRecord, bool, error)
	// begin records r as the current run.
	begin(ctx context.Context, r runRecord) error
	// add records e, an event other than a task's run, as an event of the run with ID id.
	add(ctx context.Context, id string, e event) error
	// claim records, under task's lock, that the holder with fence takes task on in run id.
	// It returns errDone when the task is done, and errStale when a holder with a higher
	// fence has claimed it: the caller's lock was lost.
	claim(ctx context.Context, id string, task int64, fence uint64) error
	// finish records e, a taskRun, as the done record of task e.Key in run id — unless the
	// task is done, or a holder with a higher fence than e.Fence has claimed it: then it
	// records e as a staleTask event, and returns errDone or errStale. A done record made
	// again (a write retried after a lost answer) is accepted and recorded once.
	finish(ctx context.Context, id string, e event) error
	// done reports whether task ran to its end in run id: whether finish accepted a record.
	done(ctx context.Context, id string, task int64) (bool, error)
	// events returns the events of run id, in no particular order.
	events(ctx context.Context, id string) ([]event, error)
}

// run is a demonstration that several processes take part in: windows of the job from epoch
// on, and a batch of tasks.
type runRecord struct {
	ID      string        `json:"id"`
	Epoch   time.Time     `json:"epoch"`   // the start of window 0
	Windows int           `json:"windows"` // 0: no end (-forever)
	Window  time.Duration `json:"window"`
	Tasks   int           `json:"tasks"` // tasks per batch
	// Tenants is how many tenants the tasks belong to (task ID modulo Tenants); Imports how
	// many tasks of one tenant may run at once, across processes.
	Tenants int `json:"tenants"`
	Imports int `json:"imports"`
}

// tenant returns the tenant of task id.
func (r runRecord) tenant(id int64) int64 { return id % int64(max(r.Tenants, 1)) }

// end returns when r's last window ends: after it, a process starts a new run. A run with no
// end of windows never ends.
func (r runRecord) end() time.Time {
	if r.Windows == 0 {
		return time.Time{}
	}
	return r.Epoch.Add(time.Duration(r.Windows) * r.Window)
}

// window returns the window that t falls in.
func (r runRecord) window(t time.Time) int64 { return int64(t.Sub(r.Epoch) / r.Window) }

// start returns when window k starts.
func (r runRecord) start(k int64) time.Time { return r.Epoch.Add(time.Duration(k) * r.Window) }

// kind tells events apart.
type kind int

const (
	jobRun   kind = iota // an instance held the job's lock and ran the report
	taskRun              // an instance held a task's lock and ran the task to its end
	busyJob              // an instance fired the report and found the window taken
	busyTask             // an instance found a task's lock held, and skipped the task
	// staleTask is a done record the journal refused: its instance's lock was lost (the
	// instance paused past its lease) and a newer holder claimed the task. Not a run.
	staleTask
	// maintenance is a round of the maintenance loop, run by the elected leader: Key is the
	// window, Fence the leader's term.
	maintenance
)

// Refusals of claim and finish. errDone is also what runTask returns for a task it finds done.
var (
	errDone  = errors.New("task already done")
	errStale = errors.New("a holder with a newer fence took the task over")
)

// taskState is what a journal keeps per task: the highest fence that claimed it, and whether
// it is done (and then the fence of its done record).
type taskState struct {
	fence uint64
	done  bool
}

// claimTask is claim's rule on a task's state s: it returns the new state, or an error.
func claimTask(s taskState, fence uint64) (taskState, error) {
	switch {
	case s.done:
		return s, errDone
	case fence < s.fence:
		return s, errStale
	}
	return taskState{fence: fence}, nil
}

// finishTask is finish's rule on a task's state s: it returns the new state and whether the
// record is the one already accepted, or an error.
func finishTask(s taskState, fence uint64) (taskState, bool, error) {
	switch {
	case s.done && s.fence == fence:
		return s, true, nil // the same record again
	case s.done:
		return s, false, errDone
	case fence < s.fence:
		return s, false, errStale
	}
	return taskState{fence: fence, done: true}, false, nil
}

// event is a run under a lock, or an attempt that found the lock busy (no fence, no end).
type event struct {
	Instance string    `json:"instance"` // "pid/n": the process, and its instance
	Kind     kind      `json:"kind"`
	Key      int64     `json:"key"` // the window, or the task ID
	Fence    uint64    `json:"fence,omitempty"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end,omitzero"`
}

// memJournal is the journal of the embedded backend: in the memory of the one process that
// uses it.
type memJournal struct {
	mu    sync.Mutex // protects run, set, byRun and tasks
	run   runRecord
	set   bool
	byRun map[string][]event
	tasks map[string]map[int64]taskState // run ID → task → state
}

func newMemJournal() *memJournal {
	return &memJournal{byRun: map[string][]event{}, tasks: map[string]map[int64]taskState{}}
}

func (j *memJournal) setup(context.Context) error { return nil }

func (j *memJournal) current(context.Context) (runRecord, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.run, j.set, nil
}

func (j *memJournal) begin(_ context.Context, r runRecord) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.run, j.set = r, true
	return nil
}

func (j *memJournal) add(_ context.Context, id string, e event) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.byRun[id] = append(j.byRun[id], e)
	return nil
}

func (j *memJournal) claim(_ context.Context, id string, task int64, fence uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.tasks[id] == nil {
		j.tasks[id] = map[int64]taskState{}
	}
	s, err := claimTask(j.tasks[id][task], fence)
	j.tasks[id][task] = s
	return err
}

func (j *memJournal) finish(_ context.Context, id string, e event) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.tasks[id] == nil {
		j.tasks[id] = map[int64]taskState{}
	}
	s, again, err := finishTask(j.tasks[id][e.Key], e.Fence)
	j.tasks[id][e.Key] = s
	switch {
	case again:
	case err != nil:
		e.Kind = staleTask
		j.byRun[id] = append(j.byRun[id], e)
	default:
		j.byRun[id] = append(j.byRun[id], e)
	}
	return err
}

func (j *memJournal) done(_ context.Context, id string, task int64) (bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.tasks[id][task].done, nil
}

func (j *memJournal) events(_ context.Context, id string) ([]event, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.byRun[id]), nil
}

// newRunID returns the ID of a run whose window 0 starts at epoch.
func newRunID(epoch time.Time) string { return strconv.FormatInt(epoch.UnixMilli(), 10) }
