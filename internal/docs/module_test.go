package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests, and removes the programs they built.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if programs.dir != "" {
			_ = os.RemoveAll(programs.dir)
		}
		os.Exit(code)
	}))
}

// root returns the repository's root, the directory of guard's go.mod.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod two levels above the test: %v", err)
	}
	return dir
}

// requireBlocks matches the require blocks of a go.mod.
var requireBlocks = regexp.MustCompile(`(?ms)^require \(\n.*?^\)\n`)

// tempModule creates, in a new temporary directory, a module called path that uses guard
// from this checkout (a replace directive) and requires what guard requires, at guard's
// versions, with guard's go.sum: the go.mod that `go mod tidy` would write, without asking
// the network. It returns the directory.
func tempModule(t *testing.T, path string) string {
	t.Helper()
	repo := root(t)
	gomod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	gosum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("module " + path + "\n\ngo 1.26.0\n\nrequire github.com/guardlock/guard v0.0.0\n\n")
	for _, block := range requireBlocks.FindAll(gomod, -1) {
		b.Write(block)
		b.WriteString("\n")
	}
	b.WriteString("replace github.com/guardlock/guard => " + repo + "\n")
	dir := t.TempDir()
	for name, content := range map[string][]byte{"go.mod": []byte(b.String()), "go.sum": gosum} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// goIn runs the go command in dir with args — offline, from the module cache, outside any
// workspace, with -race when the tests have it for build, vet and test — and fails the test
// with the command's output when it fails. It returns the output.
func goIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	if raceEnabled && len(args) > 0 && (args[0] == "build" || args[0] == "test") {
		args = append([]string{args[0], "-race"}, args[1:]...)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -buildvcs=false", "GOPROXY=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s in %s: %v\n%s\n(the module cache must hold guard's dependencies: go mod download in the repository)",
			strings.Join(args, " "), dir, err, out.String())
	}
	return out.String()
}

// programs holds the repository's commands that the pages run, built once per test binary.
var programs struct {
	once sync.Once
	dir  string
	err  error
}

// program returns the path of the binary of the command in directory pkg of the repository
// (examples/worker, examples/httpapi, cmd/guardctl), built once for all the tests.
func program(t *testing.T, pkg string) string {
	t.Helper()
	repo := root(t)
	programs.once.Do(func() {
		programs.dir, programs.err = os.MkdirTemp("", "guard-docs-")
		if programs.err != nil {
			return
		}
		args := []string{"build", "-o", programs.dir + string(filepath.Separator)}
		if raceEnabled {
			args = append(args, "-race")
		}
		// Each is a module of its own (each links etcd's client), built in its directory.
		for _, build := range []struct {
			dir  string
			pkgs []string
		}{
			{"examples/worker", []string{"."}},
			{"examples/httpapi", []string{"."}},
			{"cmd/guardctl", []string{"."}},
		} {
			cmd := exec.Command("go", append(args, build.pkgs...)...)
			cmd.Dir = filepath.Join(repo, filepath.FromSlash(build.dir))
			if out, err := cmd.CombinedOutput(); err != nil {
				programs.err = &buildError{err: err, out: string(out)}
				return
			}
		}
	})
	if programs.err != nil {
		t.Fatal(programs.err)
	}
	bin := filepath.Join(programs.dir, filepath.Base(pkg))
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no program built for %s: %v", pkg, err)
	}
	return bin
}

// buildError is a failed go build.
type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + "\n" + e.out }
