package testserver

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
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
	// DSN reaches Database as root (or as GUARD_MYSQL_DSN's user), in go-sql-driver syntax.
	DSN string
	// Database is a database name no other test uses; it is dropped when the test ends on
	// a server from GUARD_MYSQL_DSN, and dies with the temporary directory otherwise.
	Database string
	// External reports that the server came from GUARD_MYSQL_DSN: it cannot be killed,
	// restarted or paused.
	External bool
	// Addr is the server's host:port.
	Addr string
	// Dir holds the data directory and the socket of a server the test started.
	Dir string

	tb   testing.TB
	bin  string   // mariadbd
	args []string // its arguments, the same for a restart
	proc *Process
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
	m := &MySQL{Database: databaseName(tb), External: true, Addr: cfg.Addr, tb: tb}
	m.createDatabase(cfg)
	tb.Cleanup(func() {
		db, err := openRoot(cfg)
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

// StartMariaDB initialises a data directory with mariadb-install-db and starts mariadbd on a
// free loopback port, without binary logs, and creates a database for the test. The server
// is killed when the test ends. Tests that kill, restart or pause the server use it even when
// GUARD_MYSQL_DSN is set.
func StartMariaDB(tb testing.TB) *MySQL {
	tb.Helper()
	install, server := mariadbBinary(tb, "mariadb-install-db"), mariadbBinary(tb, "mariadbd")
	// A short directory of our own rather than tb.TempDir: the socket path must fit in
	// sun_path (108 bytes), and test names can be long.
	dir, err := os.MkdirTemp("", "guard-mariadb-")
	if err != nil {
		tb.Fatalf("testserver: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) }) // registered first: runs after the kill
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, install, "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		tb.Fatalf("testserver: mariadb-install-db: %v\n%s", err, out)
	}

	port := FreePort(tb)
	m := &MySQL{
		Database: databaseName(tb),
		Addr:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Dir:      dir,
		tb:       tb,
		bin:      server,
		args: []string{
			"--no-defaults",
			"--datadir=" + data,
			"--user=root",
			"--port=" + strconv.Itoa(port),
			"--bind-address=127.0.0.1",
			"--socket=" + filepath.Join(dir, "sock"),
			"--skip-log-bin",
			"--max-connections=1000", // every Guard of a test has a pool of its own
		},
	}
	m.start()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", m.Addr
	m.createDatabase(cfg)
	return m
}

// start runs mariadbd and waits until it answers a query.
func (m *MySQL) start() {
	m.tb.Helper()
	m.proc = Start(m.tb, m.Addr, mariadbHint, m.bin, m.args...)
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", m.Addr
	db, err := openRoot(cfg)
	if err == nil {
		db.Close()
		return
	}
	m.proc.Kill()
	m.tb.Fatalf("testserver: mariadbd on %s: %v\n%s", m.Addr, err, m.proc.Output())
}

// createDatabase creates m.Database on the server cfg reaches and sets m.DSN to it.
func (m *MySQL) createDatabase(cfg *mysql.Config) {
	m.tb.Helper()
	db, err := openRoot(cfg)
	if err != nil {
		m.tb.Fatalf("testserver: %v", err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE `" + m.Database + "`"); err != nil {
		m.tb.Fatalf("testserver: create database %s on %s: %v", m.Database, cfg.Addr, err)
	}
	cfg = cfg.Clone()
	cfg.DBName = m.Database
	m.DSN = cfg.FormatDSN()
}

// openRoot opens cfg without its database and waits until the server answers.
func openRoot(cfg *mysql.Config) (*sql.DB, error) {
	cfg = cfg.Clone()
	cfg.DBName = ""
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connector)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for {
		err := db.PingContext(ctx)
		if err == nil {
			return db, nil
		}
		select {
		case <-ctx.Done():
			db.Close()
			return nil, fmt.Errorf("%s does not answer after %v: %w", cfg.Addr, readyTimeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Kill stops the server at once (SIGKILL, as a crash would): open connections break and new
// ones are refused. Its data directory stays, for Restart.
func (m *MySQL) Kill() {
	m.local("Kill")
	m.proc.Kill()
}

// Restart starts the killed server again on the same port and data directory, as a crashed
// server that comes back, and waits until it answers.
func (m *MySQL) Restart() {
	m.tb.Helper()
	m.local("Restart")
	m.proc.Kill()
	m.start()
}

// Pause stops the server (SIGSTOP: a frozen VM, a stalled disk) and returns once every one of
// its threads has stopped. Connections stay open and requests hang until Resume.
func (m *MySQL) Pause() {
	m.tb.Helper()
	m.signal("Pause", syscall.SIGSTOP)
	if err := waitStopped(m.proc.cmd.Process.Pid, readyTimeout); err != nil {
		m.tb.Fatalf("testserver: pause mariadbd: %v", err)
	}
}

// Resume continues a paused server (SIGCONT).
func (m *MySQL) Resume() { m.signal("Resume", syscall.SIGCONT) }

func (m *MySQL) signal(op string, sig syscall.Signal) {
	m.tb.Helper()
	m.local(op)
	if err := m.proc.cmd.Process.Signal(sig); err != nil {
		m.tb.Fatalf("testserver: %s mariadbd: %v", op, err)
	}
}

// waitStopped polls /proc until every thread of process pid is stopped: kill(2) returns
// before a busy thread has taken the SIGSTOP, and it could still answer a request.
func waitStopped(pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		running := len(stats) == 0
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // the thread ended
			}
			// The state follows the command name, which is in parentheses.
			if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				running = true
				break
			}
		}
		if !running {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped after %v", pid, limit)
		}
		time.Sleep(time.Millisecond)
	}
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
	if m.proc == nil {
		return ""
	}
	return m.proc.Output()
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
