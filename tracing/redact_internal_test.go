package tracing

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/guardlock/guard"
)

func TestMessage(t *testing.T) {
	long := strings.Repeat("é", 70) // a NameError quotes its first 64 characters
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"n", &guard.OpError{Op: "release", Name: "n", Err: guard.ErrNotHeld}, "guard: release #redacted: lock not held"},
		{"n", errors.New("n not held; no n"), "#redacted not held; no #redacted"},
		{`a"b`, &guard.OpError{Op: "acquire", Name: `a"b`, Err: errors.New("down")}, "guard: acquire #redacted: down"},
		{`a"b`, fmt.Errorf("key %q in %q", `a"b`, `list [a"b]`), `key #redacted in "list [#redacted]"`},
		{"acct:7", errors.New("acct:77 and acct:7"), "acct:77 and #redacted"}, // another name, and the name
		{long, &guard.NameError{Name: long, Reason: "too long"}, "guard: invalid lock name #redacted: too long"},
		{"acct:7", &guard.BusyError{Name: "acct:7"}, "guard: lock #redacted is held"},
	}
	o := &Observer{names: NameDropped}
	for _, tt := range tests {
		assert.Equal(t, tt.want, o.message(tt.name, tt.err), "%s: %v", tt.name, tt.err)
	}
	o.names = NameHashed
	assert.Equal(t, "guard: lock #"+HashName("acct:7")+" is held", o.message("acct:7", &guard.BusyError{Name: "acct:7"}))
	o.names = NameRaw
	assert.Equal(t, `guard: lock "acct:7" is held`, o.message("acct:7", &guard.BusyError{Name: "acct:7"}))
}
