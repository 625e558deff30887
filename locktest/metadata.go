package locktest

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/display"
)

// metadataValues are Instance and Label values that a server keeping text may refuse or cut.
var metadataValues = []struct{ name, value string }{
	{"NUL", "worker\x00-1"},
	{"invalid UTF-8", "worker-\xff\xfe-1"},
	{"1 KiB", strings.Repeat("w", 1024)},
	{"1 KiB of 2-byte characters", strings.Repeat("é", 512)},
	{"NUL and invalid UTF-8 in 1 KiB", strings.Repeat("\x00\xffé", 256)},
}

// testMetadataValues takes locks whose Instance and Label hold NUL bytes, invalid UTF-8 and
// 1 KiB, through the Backend and through a Guard: where the Guard refuses a value, it must
// refuse it with an *guard.OptionError; every value it passes on must be taken, and kept as
// the Backend contract says (see guard.Request).
func testMetadataValues(t *testing.T, h Harness) {
	b := h.New(t).Backend
	in, _ := b.(guard.Inspector)
	for _, v := range metadataValues {
		t.Run(v.name, func(t *testing.T) {
			t.Run("Backend", func(t *testing.T) {
				name := uniqueName(t)
				r := guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute, Instance: v.value, Label: v.value}
				_, err := b.Acquire(t.Context(), r)
				require.NoError(t, err, "an acquisition failed for its metadata")
				assertStored(t, in, name, v.value, "Instance", "Label")
				require.NoError(t, b.Release(t.Context(), name, r.Token, 0))
			})
			t.Run("WithInstance", func(t *testing.T) {
				g, err := newGuardOrRefusal(b, guard.WithInstance(v.value))
				if err != nil {
					var oe *guard.OptionError
					require.ErrorAs(t, err, &oe, "the Guard refused WithInstance(%q) without an OptionError", v.value)
					t.Logf("refused: %v", err)
					return
				}
				t.Cleanup(func() { _ = g.Close(context.Background()) })
				name := uniqueName(t)
				l, err := g.TryAcquire(t.Context(), name)
				require.NoError(t, err, "an acquisition failed for its instance")
				assertStored(t, in, name, v.value, "Instance")
				require.NoError(t, l.Release(t.Context()))
			})
			t.Run("Label", func(t *testing.T) {
				g := guard.New(b)
				t.Cleanup(func() { _ = g.Close(context.Background()) })
				name := uniqueName(t)
				l, err := g.TryAcquire(t.Context(), name, guard.Label(v.value))
				if checked := guard.CheckLockOptions(guard.Label(v.value)); checked != nil {
					var oe *guard.OptionError
					require.ErrorAs(t, checked, &oe, "the Guard refused Label(%q) without an OptionError", v.value)
					require.ErrorAs(t, err, &oe, "CheckLockOptions refused Label(%q), TryAcquire did not", v.value)
					t.Logf("refused: %v", err)
					return
				}
				require.NoError(t, err, "an acquisition failed for its label")
				assertStored(t, in, name, v.value, "Label")
				require.NoError(t, l.Release(t.Context()))
			})
		})
	}
}

// newGuardOrRefusal returns guard.New(b, opts...), or what it panics with: guard.New panics
// with an invalid option's *guard.OptionError, or with its message.
func newGuardOrRefusal(b guard.Backend, opts ...guard.Option) (g *guard.Guard, err error) {
	defer func() {
		switch p := recover().(type) {
		case nil:
		case error:
			err = p
		case string:
			err = &panicked{p}
		default:
			err = fmt.Errorf("guard.New panicked with %v", p)
		}
	}()
	return guard.New(b, opts...), nil
}

// panicked is the message of a panic, which matches *guard.OptionError when it is one's.
type panicked struct{ msg string }

func (p *panicked) Error() string { return p.msg }

// As sets target to the *guard.OptionError that the message is of.
func (p *panicked) As(target any) bool {
	oe, ok := target.(**guard.OptionError)
	if !ok || !strings.HasPrefix(p.msg, "guard: invalid option ") {
		return false
	}
	option, _, _ := strings.Cut(strings.TrimPrefix(p.msg, "guard: invalid option "), "(")
	*oe = &guard.OptionError{Option: option, Reason: p.msg}
	return true
}

// assertStored checks, when in is not nil, that name's lock kept given in each of fields
// ("Instance", "Label").
func assertStored(t *testing.T, in guard.Inspector, name, given string, fields ...string) {
	t.Helper()
	if in == nil {
		return
	}
	info, err := in.Inspect(t.Context(), name)
	require.NoError(t, err)
	stored := map[string]string{"Instance": info.Instance, "Label": info.Label}
	for _, f := range fields {
		assertKept(t, f, stored[f], given)
	}
}

// assertKept checks that a backend kept given as the Backend contract allows: as given, or as
// text (guard.Request: NUL and invalid UTF-8 replaced by U+FFFD, and cut to no fewer than
// guard.MinMetadataLen characters).
func assertKept(t *testing.T, field, got, given string) {
	t.Helper()
	text := display.Text(given)
	if got == given || got == text ||
		utf8.RuneCountInString(got) >= guard.MinMetadataLen && strings.HasPrefix(text, got) {
		return
	}
	t.Errorf("%s %.40q… stored as %.40q…: neither as given nor as text cut to %d characters or more",
		field, given, got, guard.MinMetadataLen)
}
