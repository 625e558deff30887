package decorators_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/guardlock/guard/internal/guardtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prefix returns literal template text unique to the test.
func prefix(t *testing.T) string { return guardtest.Prefix(t, "decorators") }
