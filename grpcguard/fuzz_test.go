package grpcguard_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/grpcguard"
	"github.com/guardlock/guard/memstore"
)

// FuzzNamesAreInjective: two calls get one lock name exactly when the values the template
// reads are equal — one resource, one name; two resources, two names — whatever the strings,
// numbers and metadata hold.
func FuzzNamesAreInjective(f *testing.F) {
	f.Add("a", "b", int64(1), "t", "a", "b", int64(1), "t")
	f.Add("a/b", "c", int64(0), "x", "a", "b/c", int64(0), "x")
	f.Add("a:b", "", int64(-1), "%2F", "a", "b:", int64(-1), "/")
	f.Add("é", "%", int64(7), "a b", "e\u0301", "%25", int64(7), "a+b")
	b := loadBank(f)
	g := guard.New(memstore.New())
	f.Cleanup(func() { _ = g.Close(context.Background()) })
	ic, err := grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(withdraw, "acct:{account_id}:{customer.id}/{amount}@{md.x-tenant}"))
	require.NoError(f, err)
	wd := b.message(f, "WithdrawRequest", "").Descriptor()
	// The name the interceptor would lock, or "" when it refuses the call.
	name := func(acct, cust string, amount int64, tenant string) string {
		req := dynamicpb.NewMessage(wd)
		fs := req.Descriptor().Fields()
		if acct != "" {
			req.Set(fs.ByName("account_id"), protoreflect.ValueOfString(acct))
		}
		if cust != "" {
			c := req.Mutable(fs.ByName("customer")).Message()
			c.Set(c.Descriptor().Fields().ByName("id"), protoreflect.ValueOfString(cust))
		}
		if amount != 0 {
			req.Set(fs.ByName("amount"), protoreflect.ValueOfInt64(amount))
		}
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", tenant))
		got, err := ic.NameOf(ctx, withdraw, req)
		if err != nil {
			return ""
		}
		return got
	}
	f.Fuzz(func(t *testing.T, a1, c1 string, n1 int64, t1, a2, c2 string, n2 int64, t2 string) {
		x, y := name(a1, c1, n1, t1), name(a2, c2, n2, t2)
		if x == "" || y == "" {
			return // refused: a missing or empty value, or too long
		}
		same := a1 == a2 && c1 == c2 && n1 == n2 && t1 == t2
		if same != (x == y) {
			t.Fatalf("(%q,%q,%d,%q) → %q and (%q,%q,%d,%q) → %q", a1, c1, n1, t1, x, a2, c2, n2, t2, y)
		}
	})
}
