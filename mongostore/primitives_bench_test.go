package mongostore_test

import (
	"testing"

	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
)

// BenchmarkPrimitives measures the primitives on one server — round trips and allocations per
// op, uncontended and handed over between two Guards with clients of their own
// (locktest.BenchPrimitives).
func BenchmarkPrimitives(b *testing.B) {
	locktest.BenchPrimitives(b, harness(b, testserver.StartMongo(b)))
}
