package gocronlock_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/gocronlock"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/memstore"
)

// outcomes is a gocron.Monitor that reports each run's outcome: gocron records a run the
// elector refused as skipped.
type outcomes chan gocron.JobStatus

func (o outcomes) IncrementJob(_ uuid.UUID, _ string, _ []string, status gocron.JobStatus) {
	o <- status
}
func (o outcomes) RecordJobTiming(time.Time, time.Time, uuid.UUID, string, []string) {}

// TestElectorFirstTick is gocron's start-up pattern: three instances each make an Elector and
// start a scheduler right after it, with one job that runs once, at once. Exactly one
// instance must run it — not none, because every Elector was still campaigning or settling
// when the tick came.
func TestElectorFirstTick(t *testing.T) {
	for _, srv := range guardtest.Servers() {
		t.Run(srv.Name, func(t *testing.T) {
			open := srv.Start(t)
			name := lockName(t)
			done := make(outcomes, 3*instances)
			ran := make(chan int, instances)
			for i := range instances {
				g := guardtest.Instance(t, open)
				e, err := gocronlock.NewElector(g, name)
				require.NoError(t, err)
				t.Cleanup(func() { _ = e.Close(context.Background()) })
				s := newScheduler(t, gocron.WithDistributedElector(e), gocron.WithMonitor(done))
				_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
					gocron.NewTask(func() { ran <- i }), gocron.WithName(name))
				require.NoError(t, err)
				s.Start()
			}
			var statuses []gocron.JobStatus
			for range instances {
				select {
				case st := <-done:
					statuses = append(statuses, st)
				case <-time.After(30 * time.Second):
					t.Fatalf("only %d of %d schedulers decided on the job: %v", len(statuses), instances, statuses)
				}
			}
			t.Logf("outcomes: %v", statuses)
			assert.Len(t, ran, 1, "the job that runs once ran %d times", len(ran))
			assert.ElementsMatch(t, []gocron.JobStatus{gocron.Success, gocron.Skip, gocron.Skip}, statuses)
		})
	}
}

// TestElectorStaleLease pins down what the Elector's documentation says of a start-up while
// the lease of a leader that died without releasing is still on the name: nobody leads at the
// first tick, so a job that runs once at once runs nowhere; OnElected is where work that must
// run when an instance begins to lead goes, and it runs once the stale lease has run out.
func TestElectorStaleLease(t *testing.T) {
	store := memstore.New()
	name := lockName(t)
	const staleLease = 1500 * time.Millisecond
	_, err := store.Acquire(t.Context(), guard.Request{Name: name, Token: rand.Text(), TTL: staleLease, Instance: "dead leader"})
	require.NoError(t, err)
	started := time.Now()

	done := make(outcomes, 3*instances)
	ran := make(chan int, instances)
	elected := make(chan int, instances)
	for i := range instances {
		g := guard.New(store)
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		e, err := gocronlock.NewElector(g, name, gocronlock.OnElected(func(*guard.Lock) { elected <- i }))
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		s := newScheduler(t, gocron.WithDistributedElector(e), gocron.WithMonitor(done))
		_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
			gocron.NewTask(func() { ran <- i }), gocron.WithName(name))
		require.NoError(t, err)
		s.Start()
	}
	var statuses []gocron.JobStatus
	for range instances {
		select {
		case st := <-done:
			statuses = append(statuses, st)
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d schedulers decided on the job: %v", len(statuses), instances, statuses)
		}
	}
	assert.Equal(t, []gocron.JobStatus{gocron.Skip, gocron.Skip, gocron.Skip}, statuses)
	assert.Empty(t, ran, "a job ran while the dead leader's lease was on the name")

	select {
	case i := <-elected:
		t.Logf("instance %d elected %v after the start (stale lease %v)", i, time.Since(started).Round(time.Millisecond), staleLease)
		assert.GreaterOrEqual(t, time.Since(started), staleLease-100*time.Millisecond, "elected before the stale lease ran out")
	case <-time.After(30 * time.Second):
		t.Fatal("nobody was elected after the stale lease ran out")
	}
	assert.Empty(t, elected, "two instances elected")
}
