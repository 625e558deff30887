package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
)

// TestRunCommandLine runs the command in-process on command lines that never reach a backend.
func TestRunCommandLine(t *testing.T) {
	t.Setenv(backendEnv, "")
	const backend = "redis://127.0.0.1:1"
	tests := []struct {
		name string
		args []string
		code int
		want string // in stderr, or in stdout when code is 0
	}{
		{"help", []string{"-h"}, 0, "usage: guardctl [flags] command"},
		{"help after the command", []string{"list", "-help"}, 0, "redis+cluster://"},
		{"no command", []string{"-backend", backend}, 2, "no command: list, show, release or watch"},
		{"unknown command", []string{"-backend", backend, "unlock", "x"}, 2, `unknown command "unlock"`},
		{"show without a name", []string{"-backend", backend, "show"}, 2, "show takes NAME, not 0 arguments"},
		{"release with two names", []string{"-backend", backend, "release", "a", "b"}, 2, "release takes NAME, not 2 arguments"},
		{"list with two prefixes", []string{"-backend", backend, "list", "a", "b"}, 2, "list takes [prefix]"},
		{"a flag after the command", []string{"-backend", backend, "release", "a", "-yes"}, 2, "flags go before the command: guardctl -yes release"},
		{"an unknown flag", []string{"-backend", backend, "-all", "release", "a"}, 2, "flag provided but not defined: -all"},
		{"a bad duration", []string{"-timeout", "soon", "list"}, 2, `invalid value "soon" for flag -timeout`},
		{"no timeout", []string{"-backend", backend, "-timeout", "0s", "list"}, 2, "-timeout must be positive"},
		{"no interval", []string{"-backend", backend, "-interval", "-1s", "watch"}, 2, "-interval must be positive"},
		{"no backend", []string{"list"}, 2, "give -backend URL or set GUARDCTL_BACKEND"},
		{"unknown scheme", []string{"-backend", "zookeeper://127.0.0.1:2181", "list"}, 2, `unknown scheme "zookeeper"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, tt.code, code, "stdout: %s\nstderr: %s", &stdout, &stderr)
			if tt.code == 0 {
				assert.Contains(t, stdout.String(), tt.want)
				assert.Empty(t, stderr.String())
				return
			}
			assert.Empty(t, stdout.String())
			assertOneLine(t, stderr.String(), tt.want)
			assert.True(t, strings.HasSuffix(stderr.String(), " (guardctl -h for usage)\n"), stderr.String())
		})
	}
}

// TestRunBackendFromEnvironment checks that GUARDCTL_BACKEND stands in for -backend.
func TestRunBackendFromEnvironment(t *testing.T) {
	t.Setenv(backendEnv, "zookeeper://127.0.0.1:2181")
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, run(t.Context(), []string{"list"}, nil, &stdout, &stderr))
	assertOneLine(t, stderr.String(), `unknown scheme "zookeeper"`)
}

// assertOneLine checks that stderr is one line of guardctl's, which says want.
func assertOneLine(t *testing.T, stderr, want string) {
	t.Helper()
	assert.True(t, strings.HasPrefix(stderr, "guardctl: "), "stderr: %q", stderr)
	assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
	assert.True(t, strings.HasSuffix(stderr, "\n"), "stderr: %q", stderr)
	assert.Contains(t, stderr, want)
	for _, s := range []string{"panic", "goroutine ", "DATA RACE"} {
		assert.NotContains(t, stderr, s)
	}
}

// TestNamesLikeFlags: a lock named like a flag is shown and released after --; without --,
// guardctl says how.
func TestNamesLikeFlags(t *testing.T) {
	store := memstore.New()
	g := guard.New(store, guard.WithInstance("worker-1"))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	for _, name := range []string{"-yes", "--json", "-h", "--"} {
		t.Run(name, func(t *testing.T) {
			l, err := g.TryAcquire(t.Context(), name)
			require.NoError(t, err)
			code, stdout, stderr := runOn(t, store, "show", "--", name)
			require.Equal(t, 0, code, stderr)
			fields := parseFields(t, stdout)
			assert.Equal(t, name, fields["NAME"])
			assert.Equal(t, "held", fields["STATE"])
			code, stdout, stderr = runOn(t, store, "-yes", "release", "--", name)
			require.Equal(t, 0, code, stderr)
			assert.True(t, strings.HasPrefix(stdout, "released "+name+", held by worker-1"), stdout)
			require.ErrorIs(t, l.Release(t.Context()), guard.ErrNotHeld)
		})
	}
	code, _, stderr := runOn(t, store, "release", "-yes")
	assert.Equal(t, 2, code)
	assertOneLine(t, stderr, "flags go before the command: guardctl -yes release … (a name that starts with '-' goes after --: guardctl release -- -yes)")
}

// TestShowNotUTF8: a name (or instance, or label) that is not UTF-8 — byte 0xff is
// tabwriter's escape — is shown quoted, and the lines stay aligned.
func TestShowNotUTF8(t *testing.T) {
	store := memstore.New()
	_, err := store.Acquire(t.Context(), guard.Request{Name: "a\xffb", Token: "t", TTL: time.Minute, Instance: "w\xff", Label: "\xffl"})
	require.NoError(t, err)
	code, stdout, stderr := runOn(t, store, "show", "a\xffb")
	require.Equal(t, 0, code, stderr)
	fields := parseFields(t, stdout)
	assert.Equal(t, `"a\xffb"`, fields["NAME"])
	assert.Equal(t, `"w\xff"`, fields["INSTANCE"])
	assert.Equal(t, `"\xffl"`, fields["LABEL"])
	assert.NotContains(t, stdout, "\xff")
	code, stdout, stderr = runOn(t, store, "list")
	require.Equal(t, 0, code, stderr)
	rows := parseTable(t, stdout)
	require.Len(t, rows, 1)
	assert.Equal(t, `"a\xffb"`, rows[0]["NAME"])
	assert.Equal(t, "1", rows[0]["FENCE"])
}
