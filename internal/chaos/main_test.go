package chaos_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/guardlock/guard/internal/chaos"
)

// TestMain runs the tests — or, in a process the chaos run started as one of its workers (this
// test binary again, with a WorkerConfig in its environment), that worker instead. The
// coordinator starts goroutines (worker readers, the resource's server, fault proxies): none
// may outlive the tests; nor may a worker's, which fails that worker, and the run.
func TestMain(m *testing.M) {
	if ran, err := chaos.WorkerMain(); ran {
		if err == nil {
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
