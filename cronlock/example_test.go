package cronlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/cronlock"
	"github.com/guardlock/guard/memstore"
)

// Three instances of a service run the same cron entry. At each tick, every instance's cron
// runs the wrapped job; one instance takes the lock and runs it, the others skip it. Here the
// three instances fire one tick by hand.
func ExampleSkipIfLocked() {
	store := memstore.New() // stands for the Redis every instance uses
	var jobs []cron.Job
	for instance := 1; instance <= 3; instance++ {
		g := guard.New(store)
		defer g.Close(context.Background())
		skip := cronlock.MustSkipIfLocked(g, "report:hourly",
			guard.MinHold(30*time.Minute), // half the period: docs/scheduling.md
			cronlock.Logger(printLogger(instance)))
		job := cron.NewChain(skip).Then(cronlock.FuncJob(func(ctx context.Context) error {
			l, _ := guard.FromContext(ctx) // the job runs under the lock's context
			fmt.Printf("instance %d: sending the report, fence %d\n", instance, l.Fence())
			return nil
		}))
		jobs = append(jobs, job)

		c := cron.New()
		if _, err := c.AddJob("0 * * * *", job); err != nil { // at the top of every hour
			log.Fatal(err)
		}
		// c.Start(), in the service.
	}
	for _, job := range jobs {
		job.Run() // the tick, as each instance's cron fires it
	}
	// Output:
	// instance 1: sending the report, fence 1
	// instance 2: skip
	// instance 3: skip
}

// printLogger is a cron.Logger that prints what an instance's wrapper logs.
type printLogger int

func (p printLogger) Info(msg string, keysAndValues ...any) { fmt.Printf("instance %d: %s\n", p, msg) }

func (p printLogger) Error(err error, msg string, keysAndValues ...any) {
	fmt.Printf("instance %d: %s: %v\n", p, msg, err)
}
