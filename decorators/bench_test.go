package decorators_test

import (
	"context"
	"testing"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/memstore"
)

// BenchmarkCall measures one uncontended decorated call on memstore — render the name, take
// what the options say, run, release — for each primitive.
func BenchmarkCall(b *testing.B) {
	fn := func(ctx context.Context, id int) (int, error) { return id, nil }
	for _, bc := range []struct {
		name string
		opts []guard.LockOption
	}{
		{"mutex", nil},
		{"permits", []guard.LockOption{decorators.Permits(3)}},
		{"read", []guard.LockOption{decorators.Read()}},
		{"write", []guard.LockOption{decorators.Write()}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			g := guard.New(memstore.New())
			defer g.Close(context.Background())
			f := decorators.MustFunc(g, "bench:{.}", fn, bc.opts...)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f(ctx, 7); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("all-of-2", func(b *testing.B) {
		g := guard.New(memstore.New())
		defer g.Close(context.Background())
		f := decorators.MustFuncAll(g, []string{"from:{From}", "to:{To}"}, func(ctx context.Context, a Accounts) (int, error) { return 0, nil })
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f(ctx, Accounts{From: 1, To: 2}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
