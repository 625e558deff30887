package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresDSNEnv names the environment variable that points the tests at another PostgreSQL
// server (a postgres:// URL or a key=value DSN) instead of one they start.
const PostgresDSNEnv = "GUARD_POSTGRES_DSN"

// postgresHint tells how to get the PostgreSQL server binaries when they are missing.
const postgresHint = "install them with: apt-get install -y postgresql"

// postgresUser is the operating-system user that runs a server when the tests run as root:
// postgres refuses to run as root. The postgresql package creates it.
const postgresUser = "postgres"

// Postgres is a PostgreSQL server for one test: a throwaway server run as a child process on
// a free loopback port with its data in a temporary directory, or the server that
// GUARD_POSTGRES_DSN names.
type Postgres struct {
	// DSN reaches the server as its superuser (postgres, trusted, no password) on the
	// database postgres, or is the value of GUARD_POSTGRES_DSN.
	DSN string
	// Addr is the host:port the server listens on ("" for an external server).
	Addr string
	// Dir is the server's data directory ("" for an external server).
	Dir string
	// External reports that the server came from GUARD_POSTGRES_DSN.
	External bool

	tb      testing.TB
	bin     string   // directory of postgres and initdb
	sock    string   // directory of the Unix socket and the log
	runAs   []string // the command prefix that runs a server program as postgresUser
	cmd     *exec.Cmd
	reaped  chan struct{} // closed when cmd has been reaped
	stopped bool          // paused with SIGSTOP
}

// StartPostgres returns the server named by GUARD_POSTGRES_DSN when that variable is set, and
// otherwise starts one as StartPostgresServer does.
func StartPostgres(tb testing.TB) *Postgres {
	tb.Helper()
	dsn := os.Getenv(PostgresDSNEnv)
	if dsn == "" {
		return StartPostgresServer(tb)
	}
	p := &Postgres{DSN: dsn, External: true, tb: tb}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := ping(ctx, dsn); err != nil {
		tb.Fatalf("testserver: %s=%q does not answer: %v", PostgresDSNEnv, dsn, err)
	}
	return p
}

// StartPostgresServer starts a PostgreSQL server (initdb, then postgres) on a free loopback
// port with fsync off, its data and Unix socket in a new temporary directory, and waits until
// it answers queries. When the tests run as root, the server runs as the postgres user, which
// owns the directory. It is killed and its directory removed when the test ends. Tests that
// kill, restart or pause the server use it even when GUARD_POSTGRES_DSN is set.
func StartPostgresServer(tb testing.TB) *Postgres {
	tb.Helper()
	bin, err := postgresBinDir()
	if err != nil {
		tb.Fatalf("testserver: %v; %s", err, postgresHint)
	}
	p := &Postgres{tb: tb, bin: bin}
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		runuser, err := exec.LookPath("runuser")
		if err != nil {
			tb.Fatalf("testserver: postgres refuses to run as root, and runuser is missing: %v", err)
		}
		u, err := user.Lookup(postgresUser)
		if err != nil {
			tb.Fatalf("testserver: postgres refuses to run as root, and there is no user %q to run it (%v); %s",
				postgresUser, err, postgresHint)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		p.runAs = []string{runuser, "-u", postgresUser, "--"}
	}

	// Not tb.TempDir: its parent directory is private to this user, and the server may run
	// as another.
	p.sock, err = os.MkdirTemp("", "guard-postgres-")
	if err != nil {
		tb.Fatalf("testserver: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(p.sock) })
	if uid >= 0 {
		if err := os.Chown(p.sock, uid, gid); err != nil {
			tb.Fatalf("testserver: %v", err)
		}
	}
	p.Dir = filepath.Join(p.sock, "data")

	args := append(slices.Clone(p.runAs), filepath.Join(bin, "initdb"),
		"-D", p.Dir, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale", "C")
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("testserver: initdb: %v\n%s", err, out)
	}

	port := FreePort(tb)
	p.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p.DSN = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", p.Addr)
	tb.Cleanup(p.Kill)
	p.start()
	return p
}

// postgresBinDir returns the directory of the postgres and initdb programs: the one on PATH,
// or the newest under /usr/lib/postgresql (where Debian puts them, off PATH).
func postgresBinDir() (string, error) {
	if path, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(path)
		if isExecutable(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return versionOf(b) - versionOf(a) })
	for _, dir := range dirs {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", errors.New("the PostgreSQL server programs (initdb, postgres) are not on PATH nor in /usr/lib/postgresql/*/bin")
}

// versionOf returns the major version in a path /usr/lib/postgresql/<major>/bin, or 0.
func versionOf(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// start runs postgres on p.Dir and p.Addr and waits until it answers a query.
func (p *Postgres) start() {
	p.tb.Helper()
	_, port, _ := net.SplitHostPort(p.Addr)
	args := append(slices.Clone(p.runAs), filepath.Join(p.bin, "postgres"),
		"-D", p.Dir, "-p", port, "-k", p.sock,
		"-c", "listen_addresses=127.0.0.1",
		// No flush to disk, but every commit is written to the operating system before it
		// is acknowledged (synchronous_commit stays on): a killed server loses nothing.
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=200",
		"-c", "logging_collector=off",
		"-c", "log_min_messages=warning",
	)
	out := &syncBuffer{}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	// A process group of its own: a signal to the test's group (Ctrl-C) must not reach the
	// server before the test's cleanup does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A process the server started that outlives it holds our output pipe: Wait must not wait
	// for it (Kill kills such strays too).
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		p.tb.Fatalf("testserver: start postgres: %v", err)
	}
	reaped := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(reaped)
	}()
	p.cmd, p.reaped, p.stopped = cmd, reaped, false

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var err error
	for {
		if err = ping(ctx, p.DSN); err == nil {
			return
		}
		select {
		case <-reaped:
			p.tb.Fatalf("testserver: postgres on %s exited: %v\n%s", p.Addr, err, out.String())
		case <-ctx.Done():
			p.Kill()
			p.tb.Fatalf("testserver: postgres on %s not ready after %v: %v\n%s", p.Addr, readyTimeout, err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ping connects to dsn and runs a query.
func ping(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// Kill stops the server at once, as a crash would: SIGKILL to the postmaster and every
// process it started, and waits until they are gone. Open connections break and new ones are
// refused. The data directory stays, for Restart. It is safe to call more than once; it fails
// the test on an external server.
func (p *Postgres) Kill() {
	if p.External {
		p.tb.Fatalf("testserver: cannot kill the server of %s; crash tests use StartPostgresServer", PostgresDSNEnv)
	}
	if p.cmd == nil {
		return
	}
	pids := p.pids()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// A backend forked as the list was read escapes it, and may wait forever on a lock that a
	// killed process held, keeping the shared memory (a restart would refuse to start) and our
	// output pipe. Every process of the server works in its data directory: kill those too.
	strays := p.strays(pids)
	for _, pid := range strays {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	pids = append(pids, strays...)
	// Our child is runuser (or, when not root, postgres itself): it reaps the postmaster and
	// exits, and we reap it. Killing runuser first would leave the postmaster a zombie under
	// init, whose pid a restarted server would take for a live postmaster. The postmaster's
	// own children are reparented to init; wait until none is running, so that a restart
	// finds the shared memory free.
	if len(pids) == 0 {
		_ = p.cmd.Process.Kill()
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // runuser stops itself while its child is stopped
	select {
	case <-p.reaped:
	case <-time.After(readyTimeout):
		_ = p.cmd.Process.Kill()
		<-p.reaped
	}
	deadline := time.Now().Add(readyTimeout)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling the kernel: nothing to wait on
		}
	}
	p.cmd = nil
}

// Restart starts the server again on the same port and data directory after Kill (the
// server recovers what it had written), and waits until it answers.
func (p *Postgres) Restart() {
	p.tb.Helper()
	if p.External {
		p.tb.Fatalf("testserver: cannot restart the server of %s", PostgresDSNEnv)
	}
	p.Kill()
	p.start()
}

// Pause stops the server and every process it started with SIGSTOP, as a frozen VM: it
// accepts TCP connections (the kernel does) but answers nothing, until Resume.
func (p *Postgres) Pause() { p.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (p *Postgres) Resume() { p.signal(syscall.SIGCONT) }

func (p *Postgres) signal(sig syscall.Signal) {
	p.tb.Helper()
	if p.External || p.cmd == nil {
		p.tb.Fatalf("testserver: no server of this test to signal")
	}
	pids := p.pids()
	if sig == syscall.SIGCONT {
		// runuser stops itself when its child stops, and continues the child when it is
		// continued: continue it too, or it could never reap the server.
		pids = append(pids, p.cmd.Process.Pid)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			p.tb.Errorf("testserver: signal %v to %d: %v", sig, pid, err)
		}
	}
	p.stopped = sig == syscall.SIGSTOP
}

// pids returns the postmaster's pid, read from the first line of postmaster.pid, followed
// by its children's; nil when there is no postmaster.
func (p *Postgres) pids() []int {
	b, err := os.ReadFile(filepath.Join(p.Dir, "postmaster.pid"))
	if err != nil {
		return nil
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || !alive(pm) {
		return nil
	}
	return append([]int{pm}, childrenOf(pm)...)
}

// strays returns the processes, other than known, that work in the server's data directory:
// its processes that escaped a kill (a backend forked meanwhile), reparented to init.
func (p *Postgres) strays(known []int) []int {
	dir, err := filepath.EvalSymlinks(p.Dir)
	if err != nil {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || slices.Contains(known, pid) {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == dir && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// childrenOf returns the pids whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(n); ok && ppid == pid {
			kids = append(kids, n)
		}
	}
	return kids
}

// alive reports whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}
