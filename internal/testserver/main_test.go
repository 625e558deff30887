package testserver

import (
	"testing"

	"go.uber.org/goleak"
)

// The package starts goroutines (process reapers, the wire proxy): none may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
