package guard_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
)

func Example() {
	ctx := context.Background()
	store := memstore.New() // in-process; use redisstore or mongostore across processes

	// Two instances of a service, each with its own Guard on the shared backend.
	a, b := guard.New(store), guard.New(store)
	defer a.Close(ctx)
	defer b.Close(ctx)

	l, err := a.TryAcquire(ctx, "report:nightly")
	if err != nil {
		panic(err)
	}
	fmt.Println("a holds it, fence", l.Fence())

	_, err = b.TryAcquire(ctx, "report:nightly")
	fmt.Println("b:", errors.Is(err, guard.ErrNotAcquired))

	_ = l.Release(ctx)
	l, _ = b.TryAcquire(ctx, "report:nightly")
	fmt.Println("b holds it, fence", l.Fence())
	_ = l.Release(ctx)
	// Output:
	// a holds it, fence 1
	// b: true
	// b holds it, fence 2
}

func ExampleGuard_Do() {
	ctx := context.Background()
	g := guard.New(memstore.New())
	defer g.Close(ctx)

	err := g.Do(ctx, "account:42", func(ctx context.Context) error {
		l, _ := guard.FromContext(ctx)
		fmt.Println("withdrawing under fence", l.Fence())
		return nil
	}, guard.WaitTime(2*time.Second))
	fmt.Println("err:", err)
	// Output:
	// withdrawing under fence 1
	// err: <nil>
}

func ExampleLock_Context() {
	ctx := context.Background()
	g := guard.New(memstore.New())
	defer g.Close(ctx)

	l, err := g.Acquire(ctx, "import:tenant-7", guard.LeaseTime(50*time.Millisecond))
	if err != nil {
		panic(err)
	}
	<-l.Context().Done() // the work would stop here: the lease is over
	fmt.Println(errors.Is(l.Err(), guard.ErrLeaseExpired))
	// Output: true
}

func ExampleMinHold() {
	ctx := context.Background()
	store := memstore.New()
	a, b := guard.New(store), guard.New(store)
	defer a.Close(ctx)
	defer b.Close(ctx)

	job := func(g *guard.Guard, who string) {
		err := g.Do(ctx, "job:cleanup", func(context.Context) error {
			fmt.Println(who, "runs the job")
			return nil
		}, guard.WaitTime(0), guard.MinHold(time.Minute))
		if errors.Is(err, guard.ErrNotAcquired) {
			fmt.Println(who, "skips: already ran in this window")
		}
	}
	job(a, "a")
	job(b, "b") // a finished long ago, but the window is a minute
	// Output:
	// a runs the job
	// b skips: already ran in this window
}
