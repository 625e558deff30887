package chaos_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The coordinator starts goroutines (worker readers, the resource's server, fault proxies):
// none may outlive the tests. The workers are this test binary too, so a goroutine a worker
// leaks fails that worker, and the run.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
