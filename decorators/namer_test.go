package decorators_test

import (
	"context"
	"encoding"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/memstore"
)

// Level formats by kind (decimal), although it has a String method: kinds come first.
type Level int

func (l Level) String() string { return "level-" + strconv.Itoa(int(l)) }

// Point has a String method, and no kind that formats.
type Point struct{ X, Y int }

func (p Point) String() string { return strconv.Itoa(p.X) + "," + strconv.Itoa(p.Y) }

// Code implements encoding.TextMarshaler on its pointer.
type Code struct{ n int }

func (c *Code) MarshalText() ([]byte, error) { return []byte("C" + strconv.Itoa(c.n)), nil }

type Base struct{ Region string }

type Job struct {
	Base  // Region is promoted
	*Meta // Owner is promoted through a pointer

	ID      int64
	Count   uint8
	Ratio   float64
	Small   float32
	On      bool
	Level   Level
	When    time.Time
	Addr    netip.Addr
	Point   Point
	Code    Code
	Raw     []byte
	PtrID   *int
	Tags    map[string]string
	Named   map[Key]int
	Any     any
	Str     Stringer
	Text    encoding.TextMarshaler
	Acct    AccountID
	WhenPtr *time.Time
	AcctPtr *AccountID
	Boom    Boom
	private string
	Nested  struct{ Deep struct{ Name string } }
	List    []string
}

type Meta struct{ Owner string }

type Key string

// Stringer is an interface type with a String method.
type Stringer interface{ String() string }

// AccountID is a number whose zero means "not set": its IsZero method says so.
type AccountID int64

func (a AccountID) IsZero() bool { return a == 0 }

// OptID is a Stringer whose zero means "not set".
type OptID int64

func (o OptID) String() string { return strconv.FormatInt(int64(o), 10) }
func (o OptID) IsZero() bool   { return o == 0 }

// Boom's String method panics.
type Boom struct{ s *string }

func (b Boom) String() string { return *b.s }

// zeroBoom's IsZero panics.
type zeroBoom struct{}

func (zeroBoom) String() string { return "z" }
func (zeroBoom) IsZero() bool   { panic("boom") }

func newMemGuard(t *testing.T) *guard.Guard {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}

// nameOf returns the lock name that template renders for arg.
func nameOf[A any](t *testing.T, template string, arg A) (string, error) {
	t.Helper()
	f, err := decorators.Func(newMemGuard(t), template, func(ctx context.Context, _ A) (string, error) {
		l, _ := guard.FromContext(ctx)
		return l.Name(), nil
	})
	require.NoError(t, err)
	return f(t.Context(), arg)
}

func TestFormatting(t *testing.T) {
	seven := 7
	when := time.Date(2024, 5, 1, 12, 30, 0, 0, time.UTC)
	job := Job{
		Base: Base{Region: "eu"}, Meta: &Meta{Owner: "ops"},
		ID: -42, Count: 200, Ratio: 0.1, Small: 0.1, On: true, Level: 3, When: when,
		Addr: netip.MustParseAddr("10.0.0.1"), Point: Point{1, 2}, Code: Code{n: 9},
		Raw: []byte("raw"), PtrID: &seven, Tags: map[string]string{"env": "prod"},
		Named: map[Key]int{"k": 5}, Str: Point{3, 4},
	}
	job.Nested.Deep.Name = "deep"
	tests := []struct {
		template, want string
	}{
		{"j:{ID}", "j:-42"},
		{"j:{Count}", "j:200"},
		{"j:{Ratio}", "j:0.1"},
		{"j:{Small}", "j:0.1"},
		{"j:{On}", "j:true"},
		{"j:{Level}", "j:3"},
		{"j:{When}", "j:2024-05-01T12%3A30%3A00Z"},
		{"j#{When}", "j#2024-05-01T12%3A30%3A00Z"}, // ':' is escaped whatever the template
		{"j:{Addr}", "j:10.0.0.1"},
		{"j:{Point}", "j:1%2C2"},
		{"j:{Code}", "j:C9"},
		{"j:{Raw}", "j:raw"},
		{"j:{PtrID}", "j:7"},
		{"j:{Tags.env}", "j:prod"},
		{"j:{Named.k}", "j:5"},
		{"j:{Str}", "j:3%2C4"},
		{"j:{Region}", "j:eu"},
		{"j:{Base.Region}", "j:eu"},
		{"j:{Owner}", "j:ops"},
		{"j:{Nested.Deep.Name}", "j:deep"},
		{"{{j}}:{ID}/{Region}", "{j}:-42/eu"},
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			got, err := nameOf(t, tt.template, job)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			got, err = nameOf(t, tt.template, &job)
			require.NoError(t, err, "pointers are followed")
			assert.Equal(t, tt.want, got)
		})
	}

	t.Run("scalar argument", func(t *testing.T) {
		got, err := nameOf(t, "user:{.}", "a:b")
		require.NoError(t, err)
		assert.Equal(t, "user:a%3Ab", got)
		got, err = nameOf(t, "n:{.}", &seven)
		require.NoError(t, err)
		assert.Equal(t, "n:7", got)
	})
	t.Run("nil embedded pointer", func(t *testing.T) {
		_, err := nameOf(t, "j:{Owner}", Job{})
		assert.ErrorIs(t, err, guard.ErrInvalidName)
	})
	t.Run("nil interface", func(t *testing.T) {
		_, err := nameOf(t, "j:{Str}", Job{})
		assert.ErrorIs(t, err, guard.ErrInvalidName)
	})
}

// A value that cannot be formatted is a *guard.NameError, never a panic out of the decorated
// call: a typed nil in an interface field, a method that panics.
func TestFormattingFailures(t *testing.T) {
	tests := []struct {
		name, template string
		job            Job
		reason         string
	}{
		{"nil pointer as a Stringer", "j:{Str}", Job{Str: (*Point)(nil)}, "{Str}: nil"},
		{"nil pointer as a TextMarshaler", "j:{Text}", Job{Text: (*Code)(nil)}, "{Text}: nil"},
		{"String panics", "j:{Boom}", Job{}, "{Boom}: the String method of decorators_test.Boom panicked"},
		{"zero time", "j:{When}", Job{}, "{When}: zero value"},
		{"zero by IsZero", "j:{Acct}", Job{}, "{Acct}: zero value"},
		{"zero by IsZero in an interface field", "j:{Str}", Job{Str: OptID(0)}, "{Str}: zero value"},
		{"IsZero panics in an interface field", "j:{Str}", Job{Str: zeroBoom{}}, "{Str}: the IsZero method of decorators_test.zeroBoom panicked"},
		{"pointer to a zero time", "j:{WhenPtr}", Job{WhenPtr: new(time.Time)}, "{WhenPtr}: zero value"},
		{"pointer to zero by IsZero", "j:{AcctPtr}", Job{AcctPtr: new(AccountID)}, "{AcctPtr}: zero value"},
		{"nil pointer to a time", "j:{WhenPtr}", Job{}, "{WhenPtr}: nil pointer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { _, err = nameOf(t, tt.template, tt.job) })
			require.ErrorIs(t, err, guard.ErrInvalidName)
			var ne *guard.NameError
			require.ErrorAs(t, err, &ne)
			assert.Equal(t, tt.template, ne.Name)
			assert.Equal(t, tt.reason, ne.Reason)
		})
	}
	t.Run("pointer argument to a zero time", func(t *testing.T) {
		var err error
		require.NotPanics(t, func() { _, err = nameOf(t, "t:{.}", new(time.Time)) })
		var ne *guard.NameError
		require.ErrorAs(t, err, &ne)
		assert.Equal(t, "{.}: zero value", ne.Reason)
		when := time.Date(2024, 5, 1, 12, 30, 0, 0, time.UTC)
		got, err := nameOf(t, "t:{.}", &when)
		require.NoError(t, err)
		assert.Equal(t, "t:2024-05-01T12%3A30%3A00Z", got)
		acct := AccountID(7)
		got, err = nameOf(t, "j:{AcctPtr}", Job{AcctPtr: &acct})
		require.NoError(t, err)
		assert.Equal(t, "j:7", got)
	})
	t.Run("zero numbers and bools are values", func(t *testing.T) {
		got, err := nameOf(t, "j:{ID}:{On}:{Acct}", Job{Acct: 7})
		require.NoError(t, err)
		assert.Equal(t, "j:0:false:7", got)
	})
}

func TestConstructionErrors(t *testing.T) {
	g := newMemGuard(t)
	fn := func(ctx context.Context, j Job) (int, error) { return 0, nil }
	tests := []struct {
		name, template, reason string
	}{
		{"unknown field", "j:{Idd}", "has no exported field Idd"},
		{"unexported field", "j:{private}", "has no exported field private"},
		{"field of a scalar", "j:{ID.X}", "is not a struct or map"},
		{"field of a slice", "j:{List.X}", "is not a struct or map"},
		{"field of an interface", "j:{Any.X}", "is not a struct or map"},
		{"unformattable struct", "j:{Nested}", "cannot be formatted"},
		{"unformattable slice", "j:{List}", "cannot be formatted"},
		{"unformattable interface", "j:{Any}", "cannot be formatted"},
		{"map without string keys", "j:{Named.k.x}", "is not a struct or map"},
		{"empty path element", "j:{Nested..Name}", "empty element"},
		{"whole struct", "j:{.}", "cannot be formatted"},
		{"syntax", "j:{ID", "unclosed"},
		{"stray brace", "j:ID}", "unmatched"},
		{"adjacent", "j:{ID}{Region}", "need literal text between them"},
		{"empty", "", "empty template"},
		{"control bytes", "j:\x00{ID}", "control character"},
		{"no room for a value", strings.Repeat("j", guard.MaxNameLen) + ":{ID}", "no name fits in 1024 bytes"},
		{"dot next to a placeholder", "j:{ID}.{Region}", "'.' right after {ID}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decorators.Func(g, tt.template, fn)
			require.ErrorIs(t, err, guard.ErrInvalidName)
			var ne *guard.NameError
			require.ErrorAs(t, err, &ne)
			assert.Equal(t, tt.template, ne.Name)
			assert.Contains(t, ne.Reason, tt.reason)

			assert.PanicsWithValue(t, "guard/decorators: "+err.Error(), func() {
				decorators.MustFunc(g, tt.template, fn)
			})
		})
	}

	t.Run("map key type", func(t *testing.T) {
		_, err := decorators.Func(g, "m:{x}", func(ctx context.Context, m map[int]string) (int, error) { return 0, nil })
		require.ErrorIs(t, err, guard.ErrInvalidName)
		assert.ErrorContains(t, err, "without string keys")
	})
	t.Run("fixed name too long", func(t *testing.T) {
		long := make([]byte, guard.MaxNameLen+1)
		for i := range long {
			long[i] = 'x'
		}
		_, err := decorators.Func(g, string(long), fn)
		require.ErrorIs(t, err, guard.ErrInvalidName)
		_, err = decorators.Job(g, string(long), func(context.Context) error { return nil })
		require.ErrorIs(t, err, guard.ErrInvalidName)
	})
	t.Run("bad option", func(t *testing.T) {
		_, err := decorators.Func(g, "j:{ID}", fn, guard.WaitTime(-1))
		require.ErrorIs(t, err, guard.ErrInvalidOption)
		_, err = decorators.Job(g, "j", func(context.Context) error { return nil }, guard.LeaseTime(time.Millisecond))
		require.ErrorIs(t, err, guard.ErrInvalidOption)
		assert.PanicsWithValue(t, "guard/decorators: "+err.Error(), func() {
			decorators.MustJob(g, "j", func(context.Context) error { return nil }, guard.LeaseTime(time.Millisecond))
		})
	})
	t.Run("nil arguments", func(t *testing.T) {
		_, err := decorators.Func(nil, "j:{ID}", fn)
		assert.Error(t, err)
		_, err = decorators.Func[Job, int](g, "j:{ID}", nil)
		assert.Error(t, err)
		_, err = decorators.Job(g, "", func(context.Context) error { return nil })
		assert.ErrorIs(t, err, guard.ErrInvalidName)
		_, err = decorators.Job(g, "j", nil)
		assert.Error(t, err)
	})
}

func TestJobError(t *testing.T) {
	g := newMemGuard(t)
	boom := errors.New("boom")
	job := decorators.MustJob(g, "job", func(ctx context.Context) error {
		l, ok := guard.FromContext(ctx)
		require.True(t, ok)
		assert.Equal(t, "job", l.Name())
		assert.Equal(t, "job", l.Label())
		return boom
	})
	assert.ErrorIs(t, job(t.Context()), boom)
}
