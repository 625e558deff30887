package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The tests' etcd: a member of the test's own, on free loopback ports, in a temporary
// directory. Its program is, in this order: the one GUARD_ETCD names; etcd on PATH; or, in a
// checkout of guard, tools/etcd built once per test binary (the etcd server, from the Go
// module proxy).

// etcdBuild is the etcd built from tools/etcd, once per test binary.
var etcdBuild struct {
	once sync.Once
	dir  string // removed by TestMain
	bin  string
	err  error
}

// etcdBinary returns the path of an etcd program, or fails the test saying how to get one.
func etcdBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("GUARD_ETCD"); bin != "" {
		return bin
	}
	if bin, err := exec.LookPath("etcd"); err == nil {
		return bin
	}
	etcdBuild.once.Do(func() {
		var tool string
		tool, etcdBuild.err = toolsEtcd()
		if etcdBuild.err != nil {
			return
		}
		if etcdBuild.dir, etcdBuild.err = os.MkdirTemp("", "worker-etcd-"); etcdBuild.err != nil {
			return
		}
		bin := filepath.Join(etcdBuild.dir, "etcd")
		cmd := exec.Command("go", "build", "-o", bin, ".")
		cmd.Dir = tool
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			etcdBuild.err = fmt.Errorf("go build in %s: %v\n%s", tool, err, out)
			return
		}
		etcdBuild.bin = bin
	})
	if etcdBuild.err != nil {
		t.Fatalf("no etcd: %v\nset GUARD_ETCD to an etcd program, or put one on PATH (https://etcd.io/docs/latest/install/); "+
			"the test starts its own on free ports", etcdBuild.err)
	}
	return etcdBuild.bin
}

// toolsEtcd returns the directory of guard's tools/etcd module, above the working directory.
func toolsEtcd() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		tool := filepath.Join(dir, "tools", "etcd")
		if _, err := os.Stat(filepath.Join(tool, "go.mod")); err == nil {
			return tool, nil
		}
		if filepath.Dir(dir) == dir {
			return "", errors.New("not in a checkout of guard (no tools/etcd above the working directory), no etcd on PATH, and GUARD_ETCD is not set")
		}
		dir = filepath.Dir(dir)
	}
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startEtcd starts a one-member etcd cluster of the test's own and returns its client
// address, once it serves. It is killed when the test ends.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin := etcdBinary(t)
	addr, peer := freeAddr(t), freeAddr(t)
	logs := filepath.Join(t.TempDir(), "etcd.log")
	out, err := os.Create(logs)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close() // the child has its own descriptor
	cmd := exec.Command(bin, "--name", "m0", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen-client-urls", "http://"+addr, "--advertise-client-urls", "http://"+addr,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "m0=http://"+peer, "--log-level", "warn", "--listen-metrics-urls", "")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting etcd: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		var health struct{ Health string }
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			err = json.NewDecoder(res.Body).Decode(&health)
			res.Body.Close()
			if err == nil && health.Health == "true" {
				http.DefaultClient.CloseIdleConnections() // no keep-alive goroutine outlives the test
				return addr
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logs)
			t.Fatalf("etcd on %s exited before it served:\n%s", addr, b)
		case <-ctx.Done():
			b, _ := os.ReadFile(logs)
			t.Fatalf("etcd on %s did not serve within 30s:\n%s", addr, b)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
