package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/internal/testserver"
)

// The command with which docs/tracing.md asks Jaeger for the httpapi example's traces finds
// them: run as the page shows it, against a Jaeger of the test's own to which the example
// exported the spans of a deposit and two withdrawals, it prints the lock's spans.
func TestTracingPageJaegerQuery(t *testing.T) {
	query := jaegerQueryCommand(t)
	_, httpapi := exampleBinaries(t)
	j := testserver.StartJaeger(t)
	base := startHTTPAPIWithEnv(t, httpapi, []string{"-addr", "127.0.0.1:0", "-work", "5ms"},
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+j.OTLPEndpoint)
	for _, step := range []struct {
		op     string
		amount int64
	}{{"deposit", 100}, {"withdraw", 30}, {"withdraw", 20}} {
		status, body := accountsRequest(t, base, step.op, "42", step.amount)
		require.Equal(t, 200, status, body)
	}

	// The page's command, against the test's Jaeger; the spans reach the query service within
	// the exporter's batch delay (5 s) and a little more.
	script := strings.ReplaceAll(query, "localhost:16686", strings.TrimPrefix(j.QueryURL, "http://"))
	var out []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		cmd := exec.CommandContext(t.Context(), "bash", "-e", "-o", "pipefail", "-c", script)
		var err error
		out, err = cmd.CombinedOutput()
		require.NoError(t, err, "%s\n%s", script, out)
		if strings.Contains(string(out), "guard.acquire tenant:{header.X-Tenant}:account:{id}") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page's query found no acquire span of guard-httpapi within 30s:\n%s\n%.2000s", script, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	require.Contains(t, string(out), "guard-httpapi")
}

// jaegerQueryCommand returns the curl command of docs/tracing.md that asks Jaeger's query API
// for traces.
func jaegerQueryCommand(t *testing.T) string {
	t.Helper()
	f, err := os.Open("../../docs/tracing.md")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := strings.TrimSpace(s.Text()); strings.HasPrefix(line, "curl ") && strings.Contains(line, "localhost:16686/api/v3/traces") {
			return line
		}
	}
	require.NoError(t, s.Err())
	t.Fatal("docs/tracing.md shows no curl command to localhost:16686/api/v3/traces")
	return ""
}
