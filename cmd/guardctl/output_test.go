package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

var (
	acquired = time.Date(2025, 6, 10, 3, 0, 1, 123_000_000, time.UTC)
	now      = acquired.Add(12*time.Minute + 3*time.Second)
	nightly  = guard.LockInfo{
		Name: "report:nightly", Held: true, Fence: 1749524401000017,
		Instance: "worker-7f9c-2", Label: "nightly report", AcquiredAt: acquired,
		Remaining: 27*time.Second + 430*time.Millisecond, Waiting: 2,
	}
	kept = guard.LockInfo{
		Name: "report:hourly", Held: true, Kept: true, Fence: 88,
		Instance: "worker-1", AcquiredAt: acquired, Remaining: 41*time.Minute + 12*time.Second + 400*time.Millisecond,
	}
	oddName = guard.LockInfo{Name: "tenant:a\tb", Held: true, Fence: 3, Instance: "x", Remaining: 15 * time.Millisecond}
)

func TestWriteTable(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, writeTable(&out, []guard.LockInfo{kept, nightly, oddName}, time.UTC))
	want := `NAME            HELD  KEPT  FENCE             INSTANCE       LABEL           ACQUIRED              REMAINING  WAITING
report:hourly   yes   yes   88                worker-1       -               2025-06-10T03:00:01Z  41m12s     0
report:nightly  yes   no    1749524401000017  worker-7f9c-2  nightly report  2025-06-10T03:00:01Z  27.4s      2
"tenant:a\tb"   yes   no    3                 x              -               -                     15ms       0
`
	assert.Equal(t, want, out.String())
}

func TestWriteLock(t *testing.T) {
	tests := []struct {
		name string
		info guard.LockInfo
		want string
	}{
		{"held", nightly, `NAME       report:nightly
STATE      held
FENCE      1749524401000017
INSTANCE   worker-7f9c-2
LABEL      nightly report
ACQUIRED   2025-06-10T03:00:01.123Z (12m3s ago)
REMAINING  27.4s
WAITING    2
`},
		{"kept", kept, `NAME       report:hourly
STATE      kept: released, but taken until its MinHold window ends
FENCE      88
INSTANCE   worker-1
LABEL      -
ACQUIRED   2025-06-10T03:00:01.123Z (12m3s ago)
REMAINING  41m12s
WAITING    0
`},
		{"free, with what the backend still knows", guard.LockInfo{
			Name: "report:nightly", Fence: 1749524401000017, Instance: "worker-7f9c-2",
			Label: "nightly report", AcquiredAt: acquired,
		}, `NAME           report:nightly
STATE          free
LAST FENCE     1749524401000017
LAST INSTANCE  worker-7f9c-2
LAST LABEL     nightly report
LAST ACQUIRED  2025-06-10T03:00:01.123Z (12m3s ago)
`},
		{"free, never seen", guard.LockInfo{Name: "nobody"}, `NAME        nobody
STATE       free
LAST FENCE  unknown
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			require.NoError(t, writeLock(&out, tt.info, now, time.UTC))
			assert.Equal(t, tt.want, out.String())
		})
	}
}

func TestDescribe(t *testing.T) {
	assert.Equal(t, "report:nightly, held by worker-7f9c-2 (label nightly report), fence 1749524401000017, 27.4s left, 2 waiting",
		describe(nightly))
	assert.Equal(t, "report:hourly, kept for its MinHold window, fence 88, 41m12s left", describe(kept))
}

func TestJSON(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, writeJSON(&out, locksJSON([]guard.LockInfo{nightly, {Name: "free"}})))
	assert.JSONEq(t, `[
		{"name":"report:nightly","held":true,"kept":false,"fence":1749524401000017,"instance":"worker-7f9c-2",
		 "label":"nightly report","acquired_at":"2025-06-10T03:00:01.123Z","remaining_ms":27430,"waiting":2},
		{"name":"free","held":false,"kept":false,"fence":0,"instance":"","label":"","remaining_ms":0,"waiting":0}
	]`, out.String())
	assert.Equal(t, 1, strings.Count(out.String(), "\n"), "one line")

	out.Reset()
	require.NoError(t, writeJSON(&out, locksJSON(nil)))
	assert.Equal(t, "[]\n", out.String(), "no locks is an empty array, not null")
}

func TestDuration(t *testing.T) {
	tests := map[time.Duration]string{
		0:                                  "-",
		-time.Second:                       "-",
		1500 * time.Microsecond:            "2ms",
		999 * time.Millisecond:             "999ms",
		27430 * time.Millisecond:           "27.4s",
		61500 * time.Millisecond:           "1m2s",
		3*time.Hour + 400*time.Millisecond: "3h0m0s",
	}
	for d, want := range tests {
		assert.Equal(t, want, duration(d), "%v", d)
	}
}

func TestText(t *testing.T) {
	assert.Equal(t, "-", text(""))
	assert.Equal(t, "nightly report", text("nightly report"))
	assert.Equal(t, "café:Zürich", text("café:Zürich"))
	assert.Equal(t, `"a\nb"`, text("a\nb"))
	assert.Equal(t, `"\x1b[2Jx"`, text("\x1b[2Jx"), "no escape sequence reaches the terminal")
}

// pages is a List that serves fixed pages: cursor i+1 after page i.
func pages(p ...[]guard.LockInfo) func(context.Context, string) ([]guard.LockInfo, string, error) {
	return func(_ context.Context, cursor string) ([]guard.LockInfo, string, error) {
		i := 0
		if cursor != "" {
			i = int(cursor[0] - '0')
		}
		next := ""
		if i+1 < len(p) {
			next = string(rune('0' + i + 1))
		}
		return p[i], next, nil
	}
}

func TestListPages(t *testing.T) {
	a, b, c := guard.LockInfo{Name: "a", Fence: 1}, guard.LockInfo{Name: "b"}, guard.LockInfo{Name: "c"}
	again := guard.LockInfo{Name: "a", Fence: 2}

	t.Run("every page, repeats dropped, sorted", func(t *testing.T) {
		got, err := listPages(t.Context(), pages([]guard.LockInfo{c, a}, nil, []guard.LockInfo{again, b}))
		require.NoError(t, err)
		assert.Equal(t, []guard.LockInfo{a, b, c}, got, "the first of repeats stays")
	})
	t.Run("a cursor that does not move", func(t *testing.T) {
		stuck := func(context.Context, string) ([]guard.LockInfo, string, error) { return nil, "7", nil }
		_, err := listPages(t.Context(), stuck)
		require.ErrorContains(t, err, `cursor "7" again`)
	})
	t.Run("an error on a later page", func(t *testing.T) {
		boom := errors.New("boom")
		calls := 0
		failing := func(context.Context, string) ([]guard.LockInfo, string, error) {
			calls++
			if calls == 2 {
				return nil, "", boom
			}
			return []guard.LockInfo{a}, "x" + string(rune('0'+calls)), nil
		}
		_, err := listPages(t.Context(), failing)
		require.ErrorIs(t, err, boom)
	})
}

// TestJSONRoundTrip checks that what -json prints decodes into what was inspected.
func TestJSONRoundTrip(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, writeJSON(&out, toJSON(nightly)))
	var got lockJSON
	require.NoError(t, json.Unmarshal(out.Bytes(), &got))
	assert.Equal(t, toJSON(nightly), got)
}
