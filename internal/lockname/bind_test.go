package lockname

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// field binds the keys "a" and "b" to the entries of a map; any other key is refused.
func field(key string) (Source[map[string]string], error) {
	if key != "a" && key != "b" {
		return nil, errors.New("no such field")
	}
	return func(m map[string]string) (string, error) {
		v, ok := m[key]
		if !ok {
			return "", errors.New("missing")
		}
		return v, nil
	}, nil
}

func TestBind(t *testing.T) {
	n, err := Bind("p:{a}:{b}", field)
	require.NoError(t, err)
	assert.Equal(t, "p:{a}:{b}", n.String())

	name, err := n.Name(map[string]string{"a": "x:y", "b": "z"})
	require.NoError(t, err)
	assert.Equal(t, "p:x%3Ay:z", name, "Render's escaping")

	tests := []struct {
		name   string
		vals   map[string]string
		reason string
	}{
		{"source error", map[string]string{"a": "x"}, "{b}: missing"},
		{"empty value", map[string]string{"a": "", "b": "z"}, "{a}: empty value"},
		{"too long", map[string]string{"a": strings.Repeat("x", guard.MaxNameLen), "b": "z"}, "more than 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := n.Name(tt.vals)
			ne, ok := errors.AsType[*guard.NameError](err)
			require.True(t, ok, "%v is a *guard.NameError", err)
			assert.Contains(t, ne.Reason, tt.reason)
			assert.Equal(t, "p:{a}:{b}", ne.Name, "the template, not the values")
			assert.NotContains(t, ne.Error(), "xxxx", "the error does not carry the values")
		})
	}
}

// A value too long for any name is refused before it is rendered: the cost of a long value
// is its length check, not its escaping.
func BenchmarkNameTooLong(b *testing.B) {
	n, err := Bind("tenant:{a}:{b}", field)
	require.NoError(b, err)
	vals := map[string]string{"a": strings.Repeat("{x}", 1<<20/3), "b": "z"} // 1 MiB, all escaped
	b.ReportAllocs()
	for b.Loop() {
		if _, err := n.Name(vals); err == nil {
			b.Fatal("a 1 MiB name was accepted")
		}
	}
}

func TestBindErrors(t *testing.T) {
	tests := []struct {
		name, template, reason string
	}{
		{"syntax", "p:{a", "unclosed '{' (write '{{' for a literal brace) (at byte 2)"},
		{"unbound key", "p:{a}:{c}", "{c}: no such field"},
		{"fixed name too long", strings.Repeat("x", guard.MaxNameLen+1), "more than 1024"},
		{"literal text leaves no room", strings.Repeat("x", guard.MaxNameLen-2) + ":{a}:", "no name fits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Bind(tt.template, field)
			ne, ok := errors.AsType[*guard.NameError](err)
			require.True(t, ok, "%v is a *guard.NameError", err)
			assert.Contains(t, ne.Reason, tt.reason)
		})
	}
}

func TestBindFixedName(t *testing.T) {
	n, err := Bind("report:{{daily}}", func(string) (Source[int], error) {
		return nil, errors.New("not called")
	})
	require.NoError(t, err)
	name, err := n.Name(0)
	require.NoError(t, err)
	assert.Equal(t, "report:{daily}", name)
}

func TestCallOptions(t *testing.T) {
	acq, err := CallOptions("orders:{ID}", []guard.LockOption{guard.WaitTime(time.Second)})
	require.NoError(t, err)
	require.Len(t, acq, 3, "one attempt and the label, then the caller's options")
	require.NoError(t, guard.CheckLockOptions(acq...))

	_, err = CallOptions("x", []guard.LockOption{guard.WaitTime(-1)})
	assert.ErrorIs(t, err, guard.ErrInvalidOption)
}
