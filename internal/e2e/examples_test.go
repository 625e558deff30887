package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/internal/testserver"
)

// The examples are programs that users run as several processes on one server. These tests
// build them and run one, two and three processes of each on every server backend, and check
// that more processes give the verdict one process gives: the state that makes an example
// correct lives on the shared server, not in a process.

// examples holds the example binaries, built once per test binary.
var examples struct {
	once            sync.Once
	dir             string
	worker, httpapi string
	err             error
}

// exampleBinaries builds examples/worker and examples/httpapi (with -race when the tests
// have it), each in its module's directory, and returns their paths.
func exampleBinaries(t *testing.T) (worker, httpapi string) {
	t.Helper()
	examples.once.Do(func() {
		examples.dir, examples.err = os.MkdirTemp("", "guard-examples-")
		if examples.err != nil {
			return
		}
		examples.worker = filepath.Join(examples.dir, "worker")
		examples.httpapi = filepath.Join(examples.dir, "httpapi")
		for bin, dir := range map[string]string{examples.worker: "../../examples/worker", examples.httpapi: "../../examples/httpapi"} {
			args := []string{"build", "-o", bin}
			if raceEnabled {
				args = append(args, "-race")
			}
			cmd := exec.Command("go", append(args, ".")...)
			cmd.Dir = dir // a module of its own: it links etcd's client
			if out, err := cmd.CombinedOutput(); err != nil {
				examples.err = fmt.Errorf("go build in %s: %v\n%s", dir, err, out)
				return
			}
		}
	})
	require.NoError(t, examples.err)
	return examples.worker, examples.httpapi
}

// exampleServers are the server backends, each as the flags that point an example at a
// server the test starts.
var exampleServers = []struct {
	name  string
	start func(t *testing.T) []string
}{
	{"redis", func(t *testing.T) []string { return []string{"-redis", testserver.StartRedis(t).Addr} }},
	{"postgres", func(t *testing.T) []string { return []string{"-postgres", testserver.StartPostgresServer(t).DSN} }},
	{"mariadb", func(t *testing.T) []string { return []string{"-mysql", testserver.StartMariaDB(t).DSN} }},
	{"mongo", func(t *testing.T) []string {
		srv := testserver.StartMongo(t)
		u, err := url.Parse(srv.URI)
		require.NoError(t, err, "a single-host URI")
		u.Path = "/" + srv.Database
		return []string{"-mongo", u.String()}
	}},
	{"etcd", func(t *testing.T) []string {
		return []string{"-etcd", strings.Join(testserver.StartEtcd(t).Endpoints(), ",")}
	}},
}

// TestExamplesAcrossProcesses runs one, two and three processes of the worker and of the
// httpapi example on each server backend, and checks each run's verdict.
func TestExamplesAcrossProcesses(t *testing.T) {
	worker, httpapi := exampleBinaries(t)
	for _, srv := range exampleServers {
		t.Run(srv.name, func(t *testing.T) {
			flags := srv.start(t)
			for n := 1; n <= 3; n++ {
				t.Run(fmt.Sprintf("worker×%d", n), func(t *testing.T) { workerAcrossProcesses(t, worker, flags, n) })
				t.Run(fmt.Sprintf("httpapi×%d", n), func(t *testing.T) { httpapiAcrossProcesses(t, httpapi, flags, n) })
			}
			t.Run("httpapi-ids", func(t *testing.T) { httpapiDistinctIDs(t, httpapi, flags) })
		})
	}
}

// exampleEnv is the environment of an example process: the test's, without the variables
// that would choose another backend or export spans.
func exampleEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "GUARD_REDIS_ADDR" || name == "GUARD_MONGO_URI" || name == "GUARD_ETCD_ENDPOINTS" || strings.HasPrefix(name, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// importLimit is the line in which a worker process says how many tasks of each tenant ran at
// once.
var importLimit = regexp.MustCompile(`most at once: .*`)

// workerCounts is the line in which a worker process says what it ran itself.
var workerCounts = regexp.MustCompile(`this process ran (\d+) of (\d+) windows and (\d+) of (\d+) tasks`)

// workerAcrossProcesses starts n worker processes at once on one backend, in its
// demonstration mode, and checks that each says that every window and every task ran exactly
// once, and that what the processes ran themselves adds up to that: no window and no task was
// run by two processes, and none by nobody.
func workerAcrossProcesses(t *testing.T, bin string, flags []string, n int) {
	// Windows of a second: the job's hold window is half of it, which leaves room for the
	// delays of a loaded machine on top of the instances' own spread (a fifth of a window).
	const windows, tasks = 2, 12
	args := append([]string{"-instances", "2", "-windows", strconv.Itoa(windows), "-window", "1s",
		"-tasks", strconv.Itoa(tasks), "-work", "20ms", "-tenants", "2", "-imports", "2"}, flags...)
	type result struct {
		out, logs bytes.Buffer
		err       error
	}
	results := make([]*result, n)
	var wg sync.WaitGroup
	for i := range n {
		r := &result{}
		results[i] = r
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Env, cmd.Stdout, cmd.Stderr = exampleEnv(), &r.out, &r.logs
		require.NoError(t, cmd.Start())
		wg.Go(func() { r.err = cmd.Wait() })
	}
	wg.Wait()

	ranWindows, ranTasks := 0, 0
	var byProcess []string // what each process ran: "windows/tasks"
	for i, r := range results {
		require.NoError(t, r.err, "process %d of %d:\n%s\n%s", i+1, n, r.out.String(), r.logs.String())
		require.Contains(t, r.out.String(), "OK: every window ran exactly once, and every task ran exactly once.",
			"process %d of %d:\n%s", i+1, n, r.out.String())
		// The elected maintenance loop ran, and the verdict checked its terms; the import
		// limit, where the backend grants shared holds, was checked too (never more than
		// -imports tasks of a tenant at once across the processes, or the process fails).
		require.Contains(t, r.out.String(), "maintenance, led by the instance elected", "process %d of %d", i+1, n)
		limit := importLimit.FindString(r.out.String())
		require.NotEmpty(t, limit, "process %d of %d ran without its import limit:\n%s", i+1, n, r.out.String())
		t.Logf("process %d of %d: %s", i+1, n, limit)
		m := workerCounts.FindStringSubmatch(r.out.String())
		require.NotNil(t, m, "process %d of %d does not say what it ran:\n%s", i+1, n, r.out.String())
		w, _ := strconv.Atoi(m[1])
		k, _ := strconv.Atoi(m[3])
		assert.Equal(t, []string{strconv.Itoa(windows), strconv.Itoa(tasks)}, []string{m[2], m[4]})
		ranWindows += w
		ranTasks += k
		byProcess = append(byProcess, fmt.Sprintf("%d/%d", w, k))
	}
	assert.Equal(t, windows, ranWindows, "windows run by the %d processes together", n)
	assert.Equal(t, tasks, ranTasks, "tasks run by the %d processes together", n)
	t.Logf("%d worker processes: every window and every task ran exactly once; windows/tasks each process ran: %s",
		n, strings.Join(byProcess, ", "))
}

// httpapiAcrossProcesses starts n httpapi processes on one backend, deposits 100 on an account
// through the first, sends 16 concurrent withdrawals of 10 spread over all of them, and checks
// the single-process verdict: ten withdrawals go through, each seeing the one before it
// (balances 90, 80, … 0, each once), the six others are refused for insufficient funds, and
// every process then reads a balance of 0.
func httpapiAcrossProcesses(t *testing.T, bin string, flags []string, n int) {
	const (
		withdrawals = 16
		amount      = 10
		deposit     = 100
	)
	account := fmt.Sprintf("n%d", n) // a fresh account for each run on this server
	bases := make([]string, n)
	for i := range n {
		bases[i] = startHTTPAPI(t, bin, append([]string{"-addr", "127.0.0.1:0", "-work", "5ms", "-wait", "10s"}, flags...))
	}

	status, body := accountsRequest(t, bases[0], "deposit", account, deposit)
	require.Equal(t, http.StatusOK, status, body)

	// One account, however its URL spells it.
	spellings := []string{account, escapeAll(account), escapeAll(account[:1]) + account[1:]}
	type answer struct {
		status int
		body   string
	}
	answers := make(chan answer, withdrawals)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range withdrawals {
		wg.Go(func() {
			<-start
			status, body := accountsRequest(t, bases[i%n], "withdraw", spellings[i%len(spellings)], amount)
			answers <- answer{status, body}
		})
	}
	close(start)
	wg.Wait()
	close(answers)

	var balances []int64
	refused := 0
	for a := range answers {
		switch a.status {
		case http.StatusOK:
			var b struct{ Balance int64 }
			require.NoError(t, json.Unmarshal([]byte(a.body), &b))
			balances = append(balances, b.Balance)
		case http.StatusConflict:
			assert.Contains(t, a.body, "Insufficient funds")
			refused++
		default:
			t.Errorf("withdrawal: %d %s", a.status, a.body)
		}
	}
	slices.Sort(balances)
	assert.Equal(t, []int64{0, 10, 20, 30, 40, 50, 60, 70, 80, 90}, balances, "the balances the withdrawals that went through saw")
	assert.Equal(t, withdrawals-deposit/amount, refused, "withdrawals refused for insufficient funds")
	for i, base := range bases {
		status, body := accountsRequest(t, base, "", account, 0)
		require.Equal(t, http.StatusOK, status, body)
		assert.Contains(t, body, `"balance":0,`, "process %d of %d", i+1, n)
	}
	t.Logf("%d httpapi processes: %d of %d withdrawals went through, seeing balances %v; %d refused; every process reads 0",
		n, len(balances), withdrawals, balances, refused)
}

// httpapiDistinctIDs checks that account IDs that differ only in case, or in a trailing
// space, are different accounts on the server as they are different locks: two httpapi
// processes each withdraw the whole balance of one of them at once, and only the account
// that was credited pays. On a key that compares them as equal (MySQL's and MariaDB's default
// case-insensitive, space-padded collations) the withdrawals hold two different locks on one
// row, and both go through: a double withdrawal.
func httpapiDistinctIDs(t *testing.T, bin string, flags []string) {
	// -work: both withdrawals read the balance before either writes, if nothing keeps them
	// apart.
	args := append([]string{"-addr", "127.0.0.1:0", "-work", "300ms", "-wait", "5s"}, flags...)
	bases := []string{startHTTPAPI(t, bin, args), startHTTPAPI(t, bin, args)}
	ids := []string{"ab", "AB", "ab%20"} // the last is "ab "
	status, body := accountsRequest(t, bases[0], "deposit", ids[0], 100)
	require.Equal(t, http.StatusOK, status, body)

	statuses := make([]int, len(ids))
	bodies := make([]string, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { statuses[i], bodies[i] = accountsRequest(t, bases[i%2], "withdraw", id, 100) })
	}
	wg.Wait()
	assert.Equal(t, http.StatusOK, statuses[0], "the credited account: %s", bodies[0])
	for i := 1; i < len(ids); i++ {
		assert.Equal(t, http.StatusConflict, statuses[i], "account %q was never credited: %s", ids[i], bodies[i])
		assert.Contains(t, bodies[i], "Insufficient funds")
	}
	for _, id := range ids {
		status, body := accountsRequest(t, bases[1], "", id, 0)
		require.Equal(t, http.StatusOK, status, body)
		assert.Contains(t, body, `"balance":0,`, "account %q", id)
	}
}

// startHTTPAPI starts the httpapi binary with args, waits until it listens, and returns its
// base URL. When the test ends it stops the process with SIGTERM and checks that it shut down
// cleanly.
func startHTTPAPI(t *testing.T, bin string, args []string) string {
	t.Helper()
	return startHTTPAPIWithEnv(t, bin, args)
}

// startHTTPAPIWithEnv is startHTTPAPI with env ("NAME=value") added to the process's
// environment.
func startHTTPAPIWithEnv(t *testing.T, bin string, args []string, env ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(exampleEnv(), env...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var logs bytes.Buffer // written by the reader below until stderr ends
	listening := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			line := s.Text()
			logs.WriteString(line + "\n")
			if _, addr, ok := strings.Cut(line, "listening on "); ok {
				listening <- strings.Trim(addr, `"`)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-read
		return cmd.Wait()
	}
	select {
	case base := <-listening:
		t.Cleanup(func() {
			err := stop()
			assert.NoError(t, err, logs.String())
			assert.Contains(t, logs.String(), "closed: locks released", "a clean shutdown")
		})
		return base
	case <-read:
		err := cmd.Wait()
		t.Fatalf("httpapi %v exited before it listened: %v\n%s", args, err, logs.String())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-read
		_ = cmd.Wait()
		t.Fatalf("httpapi %v did not listen within 30s:\n%s", args, logs.String())
	}
	return ""
}

// accountsRequest sends a deposit, a withdrawal or (op "") a balance request for account of
// tenant acme to the httpapi at base, and returns the status and the body.
func accountsRequest(t *testing.T, base, op, account string, amount int64) (int, string) {
	method, target, body := http.MethodGet, base+"/accounts/"+account, ""
	if op != "" {
		method, target, body = http.MethodPost, target+"/"+op, fmt.Sprintf(`{"amount": %d}`, amount)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, target, strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("X-Tenant", "acme")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// escapeAll percent-encodes every byte of s.
func escapeAll(s string) string {
	var b strings.Builder
	for i := range len(s) {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}
