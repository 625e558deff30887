package docs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The walkthroughs that talk to the httpapi example work on a fresh start, as written: every
// block of curl commands to localhost:8080, run against a new httpapi started as the page
// starts it just before, gets a balance from every request — none is refused for lack of
// money, or for any other reason. When the page starts the service with -trace-stdout, the
// service prints the lock's spans.
func TestWalkthroughs(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("the walkthroughs run curl, which is not on PATH (%v): install it (apt-get install curl)", err)
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("the walkthroughs run in bash, which is not on PATH: %v", err)
	}
	repo := root(t)
	ran := 0
	for _, page := range markdownPages(t, repo) {
		content, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repo, page)
		var server []string // the last httpapi command of the page so far: its arguments
		for _, b := range codeBlocks(string(content)) {
			if !slices.Contains(shellLangs, b.lang) {
				continue
			}
			cmds := parseScript(rel, b.body)
			for _, c := range cmds {
				if len(c.words) > 2 && c.words[0] == "go" && c.words[1] == "run" && c.words[2] == "." &&
					filepath.ToSlash(c.dir) == "examples/httpapi" {
					server = c.words[3:]
				}
			}
			if !isClientBlock(cmds) {
				continue
			}
			if server == nil {
				t.Errorf("%s:%d: curl commands to localhost:8080 before any cd examples/httpapi && go run .", rel, b.line)
				continue
			}
			t.Run(strings.TrimSuffix(filepath.Base(rel), ".md"), func(t *testing.T) {
				walkthrough(t, server, b.body)
			})
			ran++
		}
	}
	if ran < 2 {
		t.Errorf("found %d walkthroughs; the quick start and the tracing page have one each", ran)
	}
}

// isClientBlock reports whether cmds are requests to the httpapi example: curl to
// localhost:8080, and nothing else but the shell's own words.
func isClientBlock(cmds []command) bool {
	curls := 0
	for _, c := range cmds {
		if c.words[0] != "curl" || !strings.Contains(strings.Join(c.words, " "), "localhost:8080") {
			return false
		}
		curls++
	}
	return curls > 0
}

// walkthrough starts the httpapi example with args on a free port, runs script against it
// in bash, and checks every answer.
func walkthrough(t *testing.T, args []string, script string) {
	bin := program(t, "examples/httpapi")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	srv := exec.Command(bin, append(slices.Clone(args), "-addr", addr)...)
	srv.Env = cleanEnv()
	var stdout bytes.Buffer
	srv.Stdout = &stdout
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	listening, read := make(chan bool, 1), make(chan struct{})
	go func() {
		defer close(read)
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			logs.WriteString(s.Text() + "\n")
			if strings.Contains(s.Text(), "listening on") {
				listening <- true
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = srv.Process.Signal(syscall.SIGTERM)
			<-read
			_ = srv.Wait()
		}
	}
	defer stop()
	select {
	case <-listening:
	case <-read:
		t.Fatalf("httpapi %v exited:\n%s", args, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("httpapi %v did not listen within 30s:\n%s", args, logs.String())
	}

	cmd := exec.Command("bash", "-e", "-o", "pipefail", "-c", strings.ReplaceAll(script, "localhost:8080", addr))
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the walkthrough failed: %v\n%s", err, out)
	}
	answers := 0
	for line := range strings.Lines(string(out)) {
		var answer struct {
			Balance *int64 `json:"balance"`
			Status  int    `json:"status"`
			Detail  string `json:"detail"`
		}
		if err := json.Unmarshal([]byte(line), &answer); err != nil || answer.Balance == nil {
			t.Errorf("an answer without a balance: %s", strings.TrimSpace(line))
			continue
		}
		answers++
	}
	t.Logf("httpapi %s; %d answers:\n%s", strings.Join(args, " "), answers, out)
	stop()
	if slices.Contains(args, "-trace-stdout") && !strings.Contains(stdout.String(), " guard.acquire ") {
		t.Errorf("httpapi -trace-stdout printed no acquire span:\n%s", stdout.String())
	}
}

// cleanEnv is the test's environment without the variables that would point the example at
// another backend or send its spans away.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != "GUARD_REDIS_ADDR" && name != "GUARD_MONGO_URI" && name != "GUARD_ETCD_ENDPOINTS" && !strings.HasPrefix(name, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}
