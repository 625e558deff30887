package gocronlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/gocronlock"
	"github.com/guardlock/guard/memstore"
)

// Three instances of a service schedule the same job every 200 ms; the Locker makes each tick
// run on one of them. The fence rises by one per tick: no tick ran twice.
func ExampleLocker() {
	store := memstore.New() // stands for the Redis every instance uses
	start := time.Now().Add(100 * time.Millisecond)
	ran := make(chan uint64, 10)
	for range 3 {
		g := guard.New(store)
		defer g.Close(context.Background())
		// The rule of docs/scheduling.md: hold for half the period.
		locker, err := gocronlock.NewLocker(g, guard.MinHold(100*time.Millisecond))
		if err != nil {
			log.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Shutdown()
		_, err = s.NewJob(gocron.DurationJob(200*time.Millisecond),
			gocron.NewTask(locker.Func(func(ctx context.Context) error {
				l, _ := guard.FromContext(ctx) // the task runs under the tick's lock
				ran <- l.Fence()
				return nil
			})),
			gocron.WithName("report"),
			gocron.WithStartAt(gocron.WithStartDateTime(start))) // the instances' ticks line up
		if err != nil {
			log.Fatal(err)
		}
		s.Start()
	}
	for range 3 {
		fmt.Println("tick ran once, fence", <-ran)
	}
	// Output:
	// tick ran once, fence 1
	// tick ran once, fence 2
	// tick ran once, fence 3
}

// A job whose period differs from the scheduler's other jobs gets a Locker of its own.
func ExampleNewLocker_perJob() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	minutely, err := gocronlock.NewLocker(g) // DefaultMinHold: jobs that run at most once a second
	if err != nil {
		log.Fatal(err)
	}
	hourly, err := gocronlock.NewLocker(g, guard.MinHold(30*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(minutely))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Shutdown()

	_, err = s.NewJob(gocron.CronJob("* * * * *", false),
		gocron.NewTask(minutely.Func(func(ctx context.Context) error { return nil })),
		gocron.WithName("metrics:flush"))
	if err != nil {
		log.Fatal(err)
	}
	_, err = s.NewJob(gocron.CronJob("0 * * * *", false),
		gocron.NewTask(hourly.Func(func(ctx context.Context) error { return nil })),
		gocron.WithName("report:hourly"),
		gocron.WithDistributedJobLocker(hourly))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
}

// Two instances elect a leader; when the leader's Guard closes, the other takes over at once.
func ExampleElector() {
	type term struct {
		instance int
		fence    uint64
	}
	store := memstore.New()
	elected := make(chan term, 2)
	var guards []*guard.Guard
	for instance := range 2 {
		g := guard.New(store)
		defer g.Close(context.Background())
		guards = append(guards, g)
		e, err := gocronlock.NewElector(g, "reports:leader",
			gocronlock.OnElected(func(l *guard.Lock) { elected <- term{instance, l.Fence()} }))
		if err != nil {
			log.Fatal(err)
		}
		defer e.Close(context.Background())

		// Only the leader runs the scheduler's jobs.
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Shutdown()
		_, err = s.NewJob(gocron.CronJob("0 3 * * *", false),
			gocron.NewTask(e.Func(func(ctx context.Context) error { return nil })), // ends with the lead
			gocron.WithName("report:nightly"))
		if err != nil {
			log.Fatal(err)
		}
		s.Start()
	}
	first := <-elected
	fmt.Println("leader elected, term", first.fence)
	guards[first.instance].Close(context.Background()) // releases the leadership lock
	second := <-elected
	fmt.Println("leader elected, term", second.fence, "on the other instance:", second.instance != first.instance)
	// Output:
	// leader elected, term 1
	// leader elected, term 2 on the other instance: true
}
