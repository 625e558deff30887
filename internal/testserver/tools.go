package testserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// tool is a test server built from a tool module of this repository (tools/<name>), from the Go
// module proxy, so that heavy servers never enter the library's go.mod.
type tool struct {
	name    string        // directory under tools/, and the binary's name
	pkg     string        // what to build, from the tool module's directory
	sources []string      // files of the tool module whose contents key the cached build
	env     string        // variable that may name a prebuilt binary instead
	hint    string        // how to get the binary when the build fails
	timeout time.Duration // for the build

	once sync.Once
	bin  string
	err  error
}

// binary returns the path of the tool's binary, building it when needed, or fails the test
// with a message that says how to get it.
func (t *tool) binary(tb testing.TB) string {
	tb.Helper()
	if bin := os.Getenv(t.env); bin != "" {
		return bin
	}
	t.once.Do(func() { t.bin, t.err = t.build() })
	if t.err != nil {
		tb.Fatalf("testserver: no %s: %v\n%s", t.name, t.err, t.hint)
	}
	return t.bin
}

// build builds the tool into a cache directory outside the repository, keyed by the tool
// module's sources and the Go version, so that test binaries and later runs reuse one build.
// A file lock keeps two test binaries that start together (go test ./...) from building it
// twice.
func (t *tool) build() (string, error) {
	src, err := toolDir(t.name)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, f := range t.sources {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	fmt.Fprintf(h, "%s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	key := hex.EncodeToString(h.Sum(nil))[:16]

	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "guard-tools", t.name+"-"+key)
	bin := filepath.Join(dir, t.name)
	if isExecutable(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(dir, "lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if isExecutable(bin) { // built by another test binary while we waited
		return bin, nil
	}

	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
	defer cancel()
	tmp := bin + ".tmp"
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", tmp, t.pkg)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in %s: %v\n%s", src, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// toolDir walks up from the working directory (a package directory under go test) to the
// repository root and returns the directory of tools/name.
func toolDir(name string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		tool := filepath.Join(dir, "tools", name)
		if _, err := os.Stat(filepath.Join(tool, "go.mod")); err == nil {
			return tool, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("tools/%s not found above the working directory", name)
		}
		dir = parent
	}
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// lockFile takes an exclusive flock on path, waiting for it, and returns its release.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
