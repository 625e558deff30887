package decorators_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/memstore"
)

type Withdrawal struct {
	AccountID string
	Amount    int
}

func ExampleFunc() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	withdraw, err := decorators.Func(g, "account:{AccountID}",
		func(ctx context.Context, w Withdrawal) (string, error) {
			l, _ := guard.FromContext(ctx) // the lock this call holds
			return fmt.Sprintf("withdrew %d under %s, fence %d", w.Amount, l.Name(), l.Fence()), nil
		})
	if err != nil {
		panic(err)
	}
	receipt, err := withdraw(context.Background(), Withdrawal{AccountID: "42", Amount: 100})
	fmt.Println(receipt, err)
	// Output: withdrew 100 under account:42, fence 1 <nil>
}

func ExampleFunc_templateError() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	_, err := decorators.Func(g, "account:{AccountId}",
		func(ctx context.Context, w Withdrawal) (string, error) { return "", nil })
	fmt.Println(errors.Is(err, guard.ErrInvalidName))
	fmt.Println(err)
	// Output:
	// true
	// guard: invalid lock name "account:{AccountId}": {AccountId}: the argument (decorators_test.Withdrawal) has no exported field AccountId
}

func ExampleFunc_busy() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	ctx := context.Background()

	withdraw := decorators.MustFunc(g, "account:{AccountID}",
		func(ctx context.Context, w Withdrawal) (string, error) { return "done", nil })

	// Another request holds account 42.
	l, _ := g.TryAcquire(ctx, "account:42")
	_, err := withdraw(ctx, Withdrawal{AccountID: "42"})
	fmt.Println("busy:", errors.Is(err, guard.ErrNotAcquired))
	l.Release(ctx)

	receipt, err := withdraw(ctx, Withdrawal{AccountID: "42"})
	fmt.Println(receipt, err)
	// Output:
	// busy: true
	// done <nil>
}

// Three instances of a service run the daily report on the same schedule; MinHold makes it
// run once per window although it finishes at once.
func ExampleJob() {
	store := memstore.New() // stands for the Redis every instance uses
	ctx := context.Background()
	for instance := 1; instance <= 3; instance++ {
		g := guard.New(store)
		defer g.Close(ctx)

		report := decorators.MustJob(g, "report:daily", func(ctx context.Context) error {
			fmt.Printf("instance %d: sending the report\n", instance)
			return nil
		}, guard.MinHold(12*time.Hour)) // half the day: docs/scheduling.md

		if err := report(ctx); errors.Is(err, guard.ErrNotAcquired) {
			fmt.Printf("instance %d: done elsewhere\n", instance)
		}
	}
	// Output:
	// instance 1: sending the report
	// instance 2: done elsewhere
	// instance 3: done elsewhere
}

// A batch whose tasks each take their own lock is processed once per task across instances.
func ExampleFunc_batch() {
	store := memstore.New()
	ctx := context.Background()
	processed := map[int]int{} // task → instance
	for instance := 1; instance <= 2; instance++ {
		g := guard.New(store)
		defer g.Close(ctx)
		process := decorators.MustFunc(g, "task:{ID}", func(ctx context.Context, t Task) (struct{}, error) {
			processed[t.ID] = instance
			return struct{}{}, nil
		}, guard.MinHold(time.Hour))

		for id := range 3 {
			if _, err := process(ctx, Task{ID: id}); errors.Is(err, guard.ErrNotAcquired) {
				continue // another instance has it
			}
		}
	}
	fmt.Println(processed)
	// Output: map[0:1 1:1 2:1]
}

type Import struct{ Tenant, File string }

// At most two imports per tenant run at once, across every instance of the service.
func ExamplePermits() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	ctx := context.Background()

	importFile := decorators.MustFunc(g, "tenant:{Tenant}:import",
		func(ctx context.Context, im Import) (string, error) {
			l, _ := guard.FromContext(ctx)
			return fmt.Sprintf("imported %s holding a %s of %s", im.File, l.Kind(), l.Name()), nil
		}, decorators.Permits(2))

	// Two imports of acme are running elsewhere.
	sem, _ := g.Semaphore("tenant:acme:import", 2)
	p1, _ := sem.TryAcquire(ctx)
	p2, _ := sem.TryAcquire(ctx)
	_, err := importFile(ctx, Import{Tenant: "acme", File: "a.csv"})
	var busy *guard.BusyError
	if errors.As(err, &busy) {
		fmt.Println("busy:", busy.Kind) // an HTTP service would answer 429 Too Many Requests
	}
	p1.Release(ctx)
	p2.Release(ctx)

	fmt.Println(importFile(ctx, Import{Tenant: "acme", File: "a.csv"}))
	// Output:
	// busy: permit
	// imported a.csv holding a permit of tenant:acme:import <nil>
}

type Transfer struct {
	From, To string
	Amount   int
}

// A transfer locks both of its accounts, or neither: a transfer the other way round at the
// same time takes them in the same order, so the two never deadlock.
func ExampleFuncAll() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	transfer := decorators.MustFuncAll(g, []string{"account:{From}", "account:{To}"},
		func(ctx context.Context, tr Transfer) (string, error) {
			l, _ := guard.FromContext(ctx)
			return fmt.Sprintf("moved %d holding %s", tr.Amount, l.Name()), nil
		})
	fmt.Println(transfer(context.Background(), Transfer{From: "42", To: "17", Amount: 10}))
	// Output: moved 10 holding account:17, account:42 <nil>
}
