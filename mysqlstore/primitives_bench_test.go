package mysqlstore

import (
	"testing"

	"github.com/guardlock/guard/locktest"
)

// BenchmarkPrimitives measures the uncontended cost of each primitive on the store — round
// trips and allocations per op — and their hand-overs between two Guards
// (locktest.BenchPrimitives).
func BenchmarkPrimitives(b *testing.B) {
	locktest.BenchPrimitives(b, startServer(b).harness())
}
