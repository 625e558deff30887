package testserver

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQLDSNEnv names the environment variable that points the tests at another MySQL-protocol
// server (a real MySQL 8, say) instead of a MariaDB of their own: a go-sql-driver DSN whose
// user may create and drop databases named guard_*. The database part of the DSN is ignored.
const MySQLDSNEnv = "GUARD_MYSQL_DSN"

// mariadbHint tells how to get mariadbd and mariadb-install-db when they are missing.
const mariadbHint = "install them with: apt-get install -y mariadb-server " +
	"(the tests start their own server on a free port; they never use the one on 3306)"

// MySQL is a MySQL-protocol server for one test: a MariaDB that the test started as a child
// process on a free loopback port, with its data in a temporary directory — or the server
// that GUARD_MYSQL_DSN names. Either way the test gets a database of its own.
type MySQL struct {
	// Process is the mariadbd the test started (Port, Exited); nil on a server from
	// GUARD_MYSQL_DSN. Kill, Restart, Pause, Resume and Output are MySQL's own.
	*Process

	// Addr is the server's host:port.
	Addr string
	// DSN reaches Database as root (or as GUARD_MYSQL_DSN's user), in go-sql-driver syntax.
	DSN string
	// Database is a database name no other test uses; it is dropped when the test ends on
	// a server from GUARD_MYSQL_DSN, and dies with the data directory otherwise.
	Database string
	// External reports that the server came from GUARD_MYSQL_DSN: it cannot be killed,
	// restarted or paused.
	External bool
	// Dir holds the data directory and the socket of a server the test started.
	Dir string

	tb  testing.TB
	cfg *mysql.Config // root on the server, no database
}

// StartMySQL returns a fresh database on the server GUARD_MYSQL_DSN names when that variable
// is set, and otherwise starts a MariaDB as StartMariaDB does.
func StartMySQL(tb testing.TB) *MySQL {
	tb.Helper()
	dsn := os.Getenv(MySQLDSNEnv)
	if dsn == "" {
		return StartMariaDB(tb)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("testserver: %s: %v", MySQLDSNEnv, err)
	}
	m := &MySQL{Database: databaseName(tb), External: true, Addr: cfg.Addr, tb: tb, cfg: cfg}
	m.createDatabase()
	tb.Cleanup(func() {
		db, err := m.open()
		if err != nil {
			tb.Errorf("testserver: %v", err)
			return
		}
		defer db.Close()
		if _, err := db.Exec("DROP DATABASE IF EXISTS `" + m.Database + "`"); err != nil {
			tb.Errorf("testserver: drop database %s: %v", m.Database, err)
		}
	})
	return m
}

// StartMariaDB initialises a data directory with mariadb-install-db, starts mariadbd on a free
// loopback port without binary logs, waits until it answers, and creates a database for the
// test. The server is killed when the test ends. Its writes are durable as MariaDB makes them
// by default (the redo log is flushed at every commit), so a server killed and restarted has
// every transaction it acknowledged. Tests that kill, restart or pause the server use it even
// when GUARD_MYSQL_DSN is set.
func StartMariaDB(tb testing.TB) *MySQL {
	tb.Helper()
	install, server := mariadbBinary(tb, "mariadb-install-db"), mariadbBinary(tb, "mariadbd")
	// A short directory of our own rather than tb.TempDir: the socket path must fit in
	// sun_path (108 bytes), and test names can be long.
	dir, err := os.MkdirTemp("", "guard-mariadb-")
	if err != nil {
		tb.Fatalf("testserver: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) }) // registered before Start's: runs after the kill
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, install, "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		tb.Fatalf("testserver: mariadb-install-db: %v\n%s", err, out)
	}

	port := FreePort(tb)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", addr
	m := &MySQL{Database: databaseName(tb), Addr: addr, Dir: dir, tb: tb, cfg: cfg}
	m.Process = Start(tb, addr, mariadbHint, server,
		"--no-defaults",
		"--datadir="+data,
		"--user=root",
		"--port="+strconv.Itoa(port),
		"--bind-address=127.0.0.1",
		"--socket="+filepath.Join(dir, "sock"),
		"--skip-log-bin",
		"--max-connections=1000", // every Guard of a test has a pool of its own
	)
	m.waitReady(tb)
	m.createDatabase()
	return m
}

// waitReady polls the server until it answers a ping: mariadbd listens before it has
// finished recovering its data.
func (m *MySQL) waitReady(tb testing.TB) {
	tb.Helper()
	db, err := m.open()
	if err != nil {
		tb.Fatalf("testserver: mariadbd on %s: %v\n%s", m.Addr, err, m.Output())
	}
	db.Close()
}

// createDatabase creates m.Database and sets m.DSN to it.
func (m *MySQL) createDatabase() {
	m.tb.Helper()
	db, err := m.open()
	if err != nil {
		m.tb.Fatalf("testserver: %v", err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE `" + m.Database + "`"); err != nil {
		m.tb.Fatalf("testserver: create database %s on %s: %v", m.Database, m.cfg.Addr, err)
	}
	cfg := m.cfg.Clone()
	cfg.DBName = m.Database
	m.DSN = cfg.FormatDSN()
}

// open connects to the server without a database and waits until it answers.
func (m *MySQL) open() (*sql.DB, error) {
	cfg := m.cfg.Clone()
	cfg.DBName = ""
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connector)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	err = poll(ctx, 20*time.Millisecond, func() error {
		if m.Process != nil && m.Exited() {
			return errExited
		}
		return db.PingContext(ctx)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("%s does not answer: %w", cfg.Addr, err)
	}
	return db, nil
}

// Kill stops the server at once (SIGKILL, as a crash would): open connections break and new
// ones are refused. Its data directory stays, for Restart.
func (m *MySQL) Kill() {
	m.local("Kill")
	m.Process.Kill()
}

// Restart starts the server again on the same port and data directory — a server that still
// runs is killed first — and waits until it has recovered and answers. It comes back with
// every transaction it committed.
func (m *MySQL) Restart(tb testing.TB) {
	tb.Helper()
	m.local("Restart")
	m.Process.Restart(tb)
	m.waitReady(tb)
}

// Pause stops the server (SIGSTOP: a frozen VM, a stalled host) and returns once every one of
// its threads has stopped. Connections stay open and requests hang until Resume (or the end
// of the test).
func (m *MySQL) Pause(tb testing.TB) {
	tb.Helper()
	m.local("Pause")
	m.Process.Pause(tb)
	// Process.Pause waits for the main thread's state. A group stop reaches each thread on
	// its own, and a connection thread that has not stopped yet can still answer: without
	// any wait, a query sent right after SIGSTOP was answered. Wait for every thread (in
	// practice they have all stopped by the time the main thread has).
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := poll(ctx, time.Millisecond, func() error { return allStopped(m.current().cmd.Process.Pid) }); err != nil {
		tb.Fatalf("testserver: pause mariadbd on %s: %v", m.Addr, err)
	}
}

// Resume continues a paused server (SIGCONT).
func (m *MySQL) Resume(tb testing.TB) {
	tb.Helper()
	m.local("Resume")
	m.Process.Resume(tb)
}

// allStopped returns nil once every thread of process pid is stopped ('T' in /proc).
func allStopped(pid int) error {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return nil // no /proc to tell: the signal is delivered before a thread runs again
	}
	for _, f := range stats {
		// A thread that ended has no stat file any more.
		if _, state, ok := statFile(f); ok && state != 'T' {
			return fmt.Errorf("thread %s is in state %q", filepath.Base(filepath.Dir(f)), state)
		}
	}
	return nil
}

// local fails the test when the server is not one the test started.
func (m *MySQL) local(op string) {
	m.tb.Helper()
	if m.External {
		m.tb.Fatalf("testserver: cannot %s the server of %s; use StartMariaDB", op, MySQLDSNEnv)
	}
}

// Output is what mariadbd printed so far ("" on a server from GUARD_MYSQL_DSN).
func (m *MySQL) Output() string {
	if m.Process == nil {
		return ""
	}
	return m.Process.Output()
}

// mariadbBinary returns the path of a MariaDB program, which Debian puts in /usr/sbin (not on
// every user's PATH), or fails the test saying how to install it.
func mariadbBinary(tb testing.TB, name string) string {
	tb.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/mysql/bin"} {
		if path := filepath.Join(dir, name); isExecutable(path) {
			return path
		}
	}
	tb.Fatalf("testserver: %s not found; %s", name, mariadbHint)
	return ""
}
