package docs

import (
	"bufio"
	"bytes"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/guardlock/guard/internal/testserver"
)

// Each example is a directory, a module of its own, that a user can copy whole, as it is,
// into a project of theirs. The test does what the user does: it copies the directory alone
// to a temporary directory outside the repository, renames the module, points its replace
// directives at this checkout (where a user would drop them and require a released guard),
// and then vets, tests, builds and runs the program. The copy must need no package of guard
// but its public ones: an import of another of guard's example packages would still build,
// from the checkout, and is what the test refuses. Its tests start an etcd of their own:
// the one the repository's tests build, named by GUARD_ETCD.
func TestExamplesInModulesOfTheirOwn(t *testing.T) {
	t.Setenv(testserver.EtcdEnv, testserver.EtcdBinary(t)) // for the copies' tests; read by the parallel subtests' go test
	for _, example := range []struct {
		name string
		run  func(t *testing.T, bin string)
	}{
		{"worker", runCopiedWorker},
		{"httpapi", runCopiedHTTPAPI},
	} {
		t.Run(example.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			copyDir(t, filepath.Join(root(t), "examples", example.name), dir)
			repo := root(t)
			goIn(t, dir, "mod", "edit", "-module", "example.com/"+example.name,
				"-replace", "github.com/guardlock/guard="+repo,
				"-replace", "github.com/guardlock/guard/etcdstore="+filepath.Join(repo, "etcdstore"))

			imports := goIn(t, dir, "list", "-f",
				`{{join .Imports "\n"}}{{"\n"}}{{join .TestImports "\n"}}{{"\n"}}{{join .XTestImports "\n"}}`, "./...")
			for imp := range strings.Lines(imports) {
				imp = strings.TrimSpace(imp)
				if strings.HasPrefix(imp, "github.com/guardlock/guard/examples") || strings.HasPrefix(imp, "github.com/guardlock/guard/internal") {
					t.Errorf("the copy of examples/%s imports %s: it is not whole", example.name, imp)
				}
			}
			goIn(t, dir, "vet", "./...")
			t.Log(goIn(t, dir, "test", "-count=1", "./..."))
			bin := filepath.Join(t.TempDir(), example.name)
			goIn(t, dir, "build", "-o", bin, ".")
			example.run(t, bin)
		})
	}
}

// copyDir copies the files under src to dst, as they are.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// runCopiedWorker runs the worker built from a copy: a short demonstration on the embedded
// backend, which must end with its OK.
func runCopiedWorker(t *testing.T, bin string) {
	cmd := exec.CommandContext(t.Context(), bin, "-instances", "2", "-windows", "1", "-window", "500ms", "-tasks", "3", "-work", "10ms")
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("OK: every window ran exactly once")) {
		t.Fatalf("the copied worker: %v\n%s", err, out)
	}
}

// runCopiedHTTPAPI starts the httpapi built from a copy, waits until it listens, and stops it
// with SIGTERM: it must shut down cleanly.
func runCopiedHTTPAPI(t *testing.T, bin string) {
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
	cmd.Env = cleanEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
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
	select {
	case <-listening:
	case <-read:
	case <-time.After(30 * time.Second):
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	<-read
	err = cmd.Wait()
	if err != nil || !strings.Contains(logs.String(), "closed: locks released") {
		t.Fatalf("the copied httpapi did not listen and shut down cleanly: %v\n%s", err, logs.String())
	}
}
