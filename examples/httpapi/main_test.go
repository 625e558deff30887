package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard/examples/internal/setup"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// With no flags and no environment the program serves on the embedded backend, says so, and
// shuts down cleanly when its context ends.
func TestRunWithoutConfiguration(t *testing.T) {
	for _, env := range setup.Variables() {
		t.Setenv(env, "")
	}
	var logs bytes.Buffer // read once run has returned
	ctx, cancel := context.WithCancel(t.Context())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-work", "0"}, slog.New(slog.NewTextHandler(&logs, nil)),
			func(a net.Addr) { addrs <- a })
	}()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs.String())
	}

	for _, step := range []struct{ method, path, body string }{
		{http.MethodPost, "/accounts/42/deposit", `{"amount": 100}`},
		{http.MethodPost, "/accounts/42/withdraw", `{"amount": 30}`},
		{http.MethodGet, "/accounts/42", ""},
	} {
		req, err := http.NewRequestWithContext(t.Context(), step.method, base+step.path, strings.NewReader(step.body))
		require.NoError(t, err)
		req.Header.Set("X-Tenant", "acme")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var body bytes.Buffer
		_, _ = body.ReadFrom(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, "%s %s: %s", step.method, step.path, body.String())
		if step.method == http.MethodGet {
			assert.JSONEq(t, `{"tenant":"acme","account":"42","balance":70,"fence":2}`, body.String())
		}
	}
	http.DefaultClient.CloseIdleConnections()

	cancel()
	require.NoError(t, <-done)
	out := logs.String()
	assert.Contains(t, out, "lock backend: the embedded in-process backend (memstore)")
	assert.Contains(t, out, "tracing off")
	assert.Contains(t, out, "closed: locks released")
}
