package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/zap"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/etcdstore"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/mysqlstore"
	"github.com/guardlock/guard/pgstore"
	"github.com/guardlock/guard/redisstore"
)

// The holders' watchdog timeout: renewals every half second, so that a force-release shows at
// the holder soon.
const watchdogTimeout = 1500 * time.Millisecond

// fixture is one backend deployment, on servers of the test's own, that the binary runs
// against.
type fixture struct {
	url   string   // the -backend URL
	flags []string // more flags for the binary, before the command
	// queues reports a backend that keeps a wait queue per name (LockInfo.Waiting).
	queues bool
	// noLastFence reports a backend that keeps nothing of a free name, not even its last
	// fence (etcd, whose revisions are the fences).
	noLastFence bool
	// store returns a Store with a client of its own, closed when the test ends.
	store func(t *testing.T) guard.Backend
}

// args returns the binary's arguments for the backend, then args.
func (fx fixture) args(args ...string) []string {
	return append(append([]string{"-backend", fx.url}, fx.flags...), args...)
}

// guard returns a Guard of the test's instance on a store of its own, closed when the test ends.
func (fx fixture) guard(t *testing.T) *guard.Guard {
	t.Helper()
	g := guard.New(fx.store(t), guard.WithInstance("test-instance"), guard.WithWatchdogTimeout(watchdogTimeout))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}

// startRedis: a single server, database 3, under a key prefix of its own (-prefix).
func startRedis(t *testing.T) fixture {
	srv := testserver.StartRedis(t)
	const prefix = "ctl-test:"
	return fixture{
		url: "redis://" + srv.Addr + "/3", flags: []string{"-prefix", prefix}, queues: true,
		store: func(t *testing.T) guard.Backend {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 3})
			t.Cleanup(func() { _ = c.Close() })
			return redisstore.New(c, redisstore.WithPrefix(prefix))
		},
	}
}

func startCluster(t *testing.T) fixture {
	c := testserver.StartCluster(t)
	return fixture{
		url: "redis+cluster://" + strings.Join(c.Addrs, ","), queues: true,
		store: func(t *testing.T) guard.Backend {
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
			t.Cleanup(func() { _ = client.Close() })
			return redisstore.New(client)
		},
	}
}

func startSentinel(t *testing.T) fixture {
	s := testserver.StartSentinel(t)
	return fixture{
		url: "redis+sentinel://" + s.Addr + "?master_name=" + s.MasterName, queues: true,
		store: func(t *testing.T) guard.Backend {
			client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: []string{s.Addr}})
			t.Cleanup(func() { _ = client.Close() })
			return redisstore.New(client)
		},
	}
}

// startMongo: FerretDB behind its proxy (or MONGODB_URI's server), a database of the test's.
func startMongo(t *testing.T) fixture {
	m := testserver.StartMongo(t)
	const collection = "locks"
	scheme, rest, _ := strings.Cut(m.URI, "://")
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	query := "collection=" + collection
	if _, q, _ := strings.Cut(tail, "?"); q != "" {
		query = q + "&" + query
	}
	return fixture{
		url: scheme + "://" + authority + "/" + m.Database + "?" + query,
		store: func(t *testing.T) guard.Backend {
			client, err := mongo.Connect(options.Client().ApplyURI(m.URI))
			require.NoError(t, err)
			t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
			return mongostore.New(client.Database(m.Database).Collection(collection))
		},
	}
}

// startPostgres: a table of the test's own, named with ?table=.
func startPostgres(t *testing.T) fixture {
	pg := testserver.StartPostgres(t)
	require.Contains(t, pg.DSN, "://", "guardctl takes a postgres:// URL; %s must be one", testserver.PostgresDSNEnv)
	table := "guardctl_test_" + strings.ToLower(strconv.FormatInt(time.Now().UnixNano(), 36))
	newPool := func(t *testing.T) *pgxpool.Pool {
		pool, err := pgxpool.New(context.Background(), pg.DSN)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	require.NoError(t, pgstore.New(newPool(t), pgstore.WithTable(table)).CreateTable(t.Context()))
	sep := "?"
	if strings.Contains(pg.DSN, "?") {
		sep = "&"
	}
	return fixture{
		url: pg.DSN + sep + "table=" + table,
		store: func(t *testing.T) guard.Backend {
			return pgstore.New(newPool(t), pgstore.WithTable(table))
		},
	}
}

// startMariaDB: the default table, in a database of the test's own.
func startMariaDB(t *testing.T) fixture {
	m := testserver.StartMySQL(t)
	cfg, err := mysql.ParseDSN(m.DSN)
	require.NoError(t, err)
	user := url.User(cfg.User)
	if cfg.Passwd != "" {
		user = url.UserPassword(cfg.User, cfg.Passwd)
	}
	open := func(t *testing.T) *sql.DB {
		connector, err := mysql.NewConnector(cfg)
		require.NoError(t, err)
		db := sql.OpenDB(connector)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	require.NoError(t, mysqlstore.New(open(t)).CreateTable(t.Context()))
	return fixture{
		url: (&url.URL{Scheme: "mysql", User: user, Host: cfg.Addr, Path: "/" + cfg.DBName}).String(),
		store: func(t *testing.T) guard.Backend {
			return mysqlstore.New(open(t))
		},
	}
}

// startEtcd: a single member, under a prefix of the test's own (the URL's path), reached
// through the member's proxy and directly: two endpoints.
func startEtcd(t *testing.T) fixture {
	c := testserver.StartEtcd(t)
	const prefix = "ctl test/"
	endpoints := []string{c.Members[0].Endpoint(), c.Members[0].Addr}
	return fixture{
		url: "etcd://" + strings.Join(endpoints, ",") + "/" + url.PathEscape(prefix), queues: true, noLastFence: true,
		store: func(t *testing.T) guard.Backend {
			client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
			require.NoError(t, err)
			s := etcdstore.New(client, etcdstore.WithPrefix(prefix))
			t.Cleanup(func() {
				_ = s.Close()
				_ = client.Close()
			})
			return s
		},
	}
}

var fixtures = []struct {
	name  string
	start func(t *testing.T) fixture
}{
	{"redis", startRedis},
	{"cluster", startCluster},
	{"sentinel", startSentinel},
	{"mongodb", startMongo},
	{"postgres", startPostgres},
	{"mariadb", startMariaDB},
	{"etcd", startEtcd},
}

// TestBinary runs the built command against every backend, on servers of its own, with
// locks held by real Guards.
func TestBinary(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			fx := f.start(t)
			t.Run("list, show and release", func(t *testing.T) { testInspectRelease(t, fx) })
			t.Run("watch", func(t *testing.T) { testWatch(t, fx) })
			t.Run("watch -json", func(t *testing.T) { testWatchJSON(t, fx) })
			t.Run("a wrong password", func(t *testing.T) { testWrongPassword(t, fx) })
		})
	}
}

// result is what one run of the binary did.
type result struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// ctl runs the binary with args and stdin (nil: /dev/null), without GUARDCTL_BACKEND.
func ctl(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), binary, args...)
	cmd.Env = append(os.Environ(), backendEnv+"=")
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("guardctl %q: %v", args, err)
	}
	for _, s := range []string{"panic", "goroutine ", "DATA RACE"} {
		require.NotContains(t, r.stderr, s, "guardctl %q", args)
	}
	return r
}

// ok runs the binary and requires it to succeed without a word on stderr.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	r := ctl(t, nil, args...)
	require.Equal(t, 0, r.code, "guardctl %q: %s", args, r.stderr)
	require.Empty(t, r.stderr)
	return r.stdout
}

// decode decodes JSON that the binary printed.
func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(out), &v), "%s", out)
	return v
}

func acquire(t *testing.T, g *guard.Guard, name string, opts ...guard.LockOption) *guard.Lock {
	t.Helper()
	l, err := g.TryAcquire(t.Context(), name, opts...)
	require.NoError(t, err, "acquire %s", name)
	return l
}

// ended waits until l's context ends, and returns why.
func ended(t *testing.T, l *guard.Lock) error {
	t.Helper()
	select {
	case <-l.Done():
		return l.Err()
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: the holder's context did not end", l.Name())
		return nil
	}
}

func testInspectRelease(t *testing.T, fx fixture) {
	g := fx.guard(t)
	before := time.Now()
	a := acquire(t, g, "ctl:a", guard.Label("nightly report"))
	b := acquire(t, g, "ctl:b")
	acquire(t, g, "other:c")
	kept := acquire(t, g, "ctl:kept", guard.MinHold(time.Hour), guard.Label("hourly"))
	require.NoError(t, kept.Release(t.Context())) // taken until the window ends, by no owner
	after := time.Now()

	// list: a table, aligned, sorted by name.
	rows := parseTable(t, ok(t, fx.args("list", "ctl:")...))
	require.Len(t, rows, 3)
	assert.Equal(t, []string{"ctl:a", "ctl:b", "ctl:kept"}, []string{rows[0]["NAME"], rows[1]["NAME"], rows[2]["NAME"]})
	assert.Equal(t, map[string]string{
		"NAME": "ctl:a", "HELD": "yes", "KEPT": "no", "FENCE": strconv.FormatUint(a.Fence(), 10),
		"INSTANCE": "test-instance", "LABEL": "nightly report", "WAITING": "0",
		"ACQUIRED": rows[0]["ACQUIRED"], "REMAINING": rows[0]["REMAINING"],
	}, rows[0])
	at, err := time.Parse(time.RFC3339, rows[0]["ACQUIRED"])
	require.NoError(t, err)
	assert.WithinRange(t, at, before.Add(-time.Minute), after.Add(time.Minute), "by the backend's clock")
	remaining, err := time.ParseDuration(rows[0]["REMAINING"])
	require.NoError(t, err)
	assert.Positive(t, remaining)
	assert.LessOrEqual(t, remaining, watchdogTimeout)
	assert.Equal(t, "-", rows[1]["LABEL"])
	assert.Equal(t, []string{"yes", "yes", "hourly"}, []string{rows[2]["HELD"], rows[2]["KEPT"], rows[2]["LABEL"]})

	// list without a prefix: everything.
	all := decode[[]lockJSON](t, ok(t, fx.args("-json", "list")...))
	var names []string
	for _, l := range all {
		names = append(names, l.Name)
	}
	assert.Equal(t, []string{"ctl:a", "ctl:b", "ctl:kept", "other:c"}, names)

	// list -json.
	locks := decode[[]lockJSON](t, ok(t, fx.args("-json", "list", "ctl:")...))
	require.Len(t, locks, 3)
	assert.Equal(t, "ctl:a", locks[0].Name)
	assert.Equal(t, a.Fence(), locks[0].Fence)
	assert.Equal(t, b.Fence(), locks[1].Fence)
	assert.Equal(t, kept.Fence(), locks[2].Fence)
	assert.True(t, locks[0].Held)
	assert.False(t, locks[0].Kept)
	assert.True(t, locks[2].Kept)
	assert.Equal(t, "test-instance", locks[0].Instance)
	assert.Equal(t, "nightly report", locks[0].Label)
	assert.WithinRange(t, locks[0].AcquiredAt, before.Add(-time.Minute), after.Add(time.Minute))
	assert.Positive(t, locks[0].RemainingMS)
	assert.Greater(t, locks[2].RemainingMS, int64(time.Hour/time.Millisecond-60_000), "the rest of the MinHold window")

	// show.
	fields := parseFields(t, ok(t, fx.args("show", "ctl:a")...))
	assert.Equal(t, "held", fields["STATE"])
	assert.Equal(t, strconv.FormatUint(a.Fence(), 10), fields["FENCE"])
	assert.Equal(t, "test-instance", fields["INSTANCE"])
	assert.Equal(t, "nightly report", fields["LABEL"])
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\S+ \(.* ago\)$|^\d{4}-\d\d-\d\dT\S+$`, fields["ACQUIRED"])
	shown := decode[lockJSON](t, ok(t, fx.args("-json", "show", "ctl:a")...))
	assert.Equal(t, locks[0].Fence, shown.Fence)
	assert.True(t, shown.Held)

	// release without -yes and without a terminal: refused, nothing released.
	r := ctl(t, strings.NewReader("y\n"), fx.args("release", "ctl:a")...)
	assert.Equal(t, 2, r.code)
	assertOneLine(t, r.stderr, "no terminal to confirm on: add -yes")
	require.NoError(t, a.Err(), "the lock was not released")

	// release -yes: the holder finds out at its next renewal; the next holder gets a higher
	// fence.
	released := time.Now()
	out := ok(t, fx.args("-yes", "release", "ctl:a")...)
	assert.Equal(t, fmt.Sprintf("released ctl:a, held by test-instance (label nightly report), fence %d, ", a.Fence()),
		out[:strings.LastIndex(out, ", ")+2])
	require.ErrorIs(t, ended(t, a), guard.ErrLockLost)
	t.Logf("the holder's context ended %v after the release", time.Since(released).Round(time.Millisecond))

	fields = parseFields(t, ok(t, fx.args("show", "ctl:a")...))
	assert.Equal(t, "free", fields["STATE"])
	free := decode[lockJSON](t, ok(t, fx.args("-json", "show", "ctl:a")...))
	assert.False(t, free.Held)
	if fx.noLastFence {
		assert.Equal(t, "unknown", fields["LAST FENCE"])
		assert.Zero(t, free.Fence)
	} else {
		assert.Equal(t, strconv.FormatUint(a.Fence(), 10), fields["LAST FENCE"])
		assert.Equal(t, a.Fence(), free.Fence)
	}

	g2 := fx.guard(t)
	next := acquire(t, g2, "ctl:a")
	assert.Greater(t, next.Fence(), a.Fence())

	// A free name is not released: exit status 1, one line.
	r = ctl(t, nil, fx.args("-yes", "release", "ctl:never")...)
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "guardctl: release ctl:never: guard: lock not held\n", r.stderr)
	assert.Empty(t, r.stdout)

	// release -json, with a caller waiting: the waiter gets the name, with a higher fence.
	waiterCtx, cancelWaiter := context.WithCancel(t.Context())
	defer cancelWaiter()
	waited := make(chan *guard.Lock, 1)
	go func() {
		l, err := g2.Acquire(waiterCtx, "ctl:b")
		if err != nil {
			l = nil
		}
		waited <- l
	}()
	defer func() {
		cancelWaiter()
		if l := <-waited; l != nil {
			_ = l.Release(context.Background())
		}
	}()
	if fx.queues {
		require.Eventually(t, func() bool {
			return decode[lockJSON](t, ok(t, fx.args("-json", "show", "ctl:b")...)).Waiting == 1
		}, 10*time.Second, 50*time.Millisecond, "the waiter never showed in WAITING")
	}
	releasedB := decode[lockJSON](t, ok(t, fx.args("-yes", "-json", "release", "ctl:b")...))
	assert.Equal(t, "ctl:b", releasedB.Name)
	assert.Equal(t, b.Fence(), releasedB.Fence)
	assert.True(t, releasedB.Held, "release -json prints the lock as it was")
	select {
	case l := <-waited:
		require.NotNil(t, l, "the waiter failed")
		assert.Greater(t, l.Fence(), b.Fence())
		waited <- l // for the deferred release
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter did not get the released name")
	}
	require.ErrorIs(t, ended(t, b), guard.ErrLockLost)

	// A MinHold window is broken too.
	ok(t, fx.args("-yes", "release", "ctl:kept")...)
	again := acquire(t, g2, "ctl:kept")
	assert.Greater(t, again.Fence(), kept.Fence())
}

// headerColumns are the columns of list's table.
var headerColumns = strings.Fields(strings.ReplaceAll(tableHeader, "\t", " "))

// parseTable reads list's table by the columns of its header: each cell must start where
// its column's title does, which is what aligned means.
func parseTable(t *testing.T, out string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Equal(t, headerColumns, strings.Fields(lines[0]), "header:\n%s", out)
	starts := make([]int, len(headerColumns))
	for i, c := range headerColumns {
		starts[i] = strings.Index(lines[0], c)
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		row := make(map[string]string)
		for i, c := range headerColumns {
			require.Greater(t, len(line), starts[i], "row %q", line)
			end := len(line)
			if i+1 < len(starts) {
				end = starts[i+1]
			}
			if i > 0 {
				require.Equal(t, byte(' '), line[starts[i]-1], "column %s of %q is not aligned:\n%s", c, line, out)
			}
			row[c] = strings.TrimSpace(line[starts[i]:end])
		}
		rows = append(rows, row)
	}
	return rows
}

var fieldLine = regexp.MustCompile(`^([A-Z]+(?: [A-Z]+)?) {2,}(\S.*)$`)

// parseFields reads show's output: a field per line.
func parseFields(t *testing.T, out string) map[string]string {
	t.Helper()
	fields := make(map[string]string)
	for line := range strings.Lines(out) {
		m := fieldLine.FindStringSubmatch(strings.TrimSuffix(line, "\n"))
		require.NotNil(t, m, "line %q of:\n%s", line, out)
		fields[m[1]] = m[2]
	}
	return fields
}

// watcher is a running guardctl watch.
type watcher struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr bytes.Buffer
}

func startWatch(t *testing.T, args ...string) *watcher {
	t.Helper()
	w := &watcher{cmd: exec.Command(binary, args...), lines: make(chan string, 100)}
	w.cmd.Env = append(os.Environ(), backendEnv+"=")
	w.cmd.Stderr = &w.stderr
	out, err := w.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, w.cmd.Start())
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		for range w.lines {
		}
		_ = w.cmd.Wait()
	})
	return w
}

// next returns the next line the watch printed.
func (w *watcher) next(t *testing.T) string {
	t.Helper()
	select {
	case line, open := <-w.lines:
		require.True(t, open, "watch ended: %s", &w.stderr)
		return line
	case <-time.After(20 * time.Second):
		t.Fatalf("watch printed nothing for 20 s: %s", &w.stderr)
		return ""
	}
}

// interrupt stops the watch as ^C does, and requires it to exit with status 0, quietly.
func (w *watcher) interrupt(t *testing.T) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(os.Interrupt))
	for range w.lines {
	}
	require.NoError(t, w.cmd.Wait(), "stderr: %s", &w.stderr)
	assert.Equal(t, 0, w.cmd.ProcessState.ExitCode())
	assert.Empty(t, w.stderr.String())
}

func testWatch(t *testing.T, fx fixture) {
	g := fx.guard(t)
	l := acquire(t, g, "watch:text", guard.Label("watched"))
	w := startWatch(t, fx.args("-interval", "100ms", "watch", "watch:text")...)
	for refresh := range 2 {
		header := w.next(t)
		require.True(t, strings.HasPrefix(header, "Every 100ms: guardctl list \"watch:text\" on "), "refresh %d: %q", refresh, header)
		require.Empty(t, w.next(t))
		var table strings.Builder
		for line := w.next(t); line != ""; line = w.next(t) {
			table.WriteString(line + "\n")
		}
		rows := parseTable(t, table.String())
		require.Len(t, rows, 1)
		assert.Equal(t, "watch:text", rows[0]["NAME"])
		assert.Equal(t, strconv.FormatUint(l.Fence(), 10), rows[0]["FENCE"])
	}
	w.interrupt(t)
}

func testWatchJSON(t *testing.T, fx fixture) {
	g := fx.guard(t)
	l := acquire(t, g, "watch:json")
	w := startWatch(t, fx.args("-json", "-interval", "100ms", "watch", "watch:json")...)
	for range 2 {
		locks := decode[[]lockJSON](t, w.next(t))
		require.Len(t, locks, 1)
		assert.Equal(t, l.Fence(), locks[0].Fence)
	}
	w.interrupt(t)
}

// TestBinaryListPages lists more locks than one page holds, on a Cluster, where the pages go
// through the masters one after the other.
func TestBinaryListPages(t *testing.T) {
	t.Parallel()
	fx := startCluster(t)
	g := fx.guard(t)
	const n = 2*pageSize + 100
	want := make(map[string]uint64, n)
	for i := range n {
		name := fmt.Sprintf("bulk:%04d", i)
		want[name] = acquire(t, g, name, guard.LeaseTime(time.Minute)).Fence()
	}
	locks := decode[[]lockJSON](t, ok(t, fx.args("-json", "list", "bulk:")...))
	require.Len(t, locks, n, "every lock once")
	for i, l := range locks {
		require.Equal(t, fmt.Sprintf("bulk:%04d", i), l.Name, "sorted, no repeats")
		require.Equal(t, want[l.Name], l.Fence)
	}
}

// TestBinaryErrors checks the failures that never reach a lock: each is one line on stderr and
// a non-zero exit status, and an unreachable server costs at most -timeout.
func TestBinaryErrors(t *testing.T) {
	t.Parallel()
	refused := net.JoinHostPort("127.0.0.1", strconv.Itoa(testserver.FreePort(t)))

	// silent accepts connections and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = silent.Close()
		<-accepted
	})
	quiet := silent.Addr().String()

	const timeout = time.Second
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown scheme", []string{"-backend", "zookeeper://" + refused, "list"}, 2, `unknown scheme "zookeeper"`},
		{"no command", []string{"-backend", "redis://" + refused}, 2, "no command"},
		{"show without a name", []string{"-backend", "redis://" + refused, "show"}, 2, "show takes NAME"},
		{"release without a name", []string{"-backend", "redis://" + refused, "-yes", "release"}, 2, "release takes NAME"},
		{"no backend", []string{"list"}, 2, "GUARDCTL_BACKEND"},
		{"redis refused", []string{"-backend", "redis://" + refused, "list"}, 1, "connection refused"},
		{"redis silent", []string{"-backend", "redis://" + quiet, "show", "x"}, 1, "no answer within 1s"},
		{"cluster refused", []string{"-backend", "redis+cluster://" + refused, "list"}, 1, "connection refused"},
		{"sentinel refused", []string{"-backend", "redis+sentinel://" + refused + "?master_name=m", "list"}, 1, "connection refused"},
		{"mongodb refused", []string{"-backend", "mongodb://" + refused + "/db?collection=locks", "show", "x"}, 1, "connection refused"},
		{"mongodb silent", []string{"-backend", "mongodb://" + quiet + "/db?collection=locks", "show", "x"}, 1, "no answer within 1s"},
		{"postgres refused", []string{"-backend", "postgres://u@" + refused + "/db?sslmode=disable", "show", "x"}, 1, "connection refused"},
		{"postgres silent", []string{"-backend", "postgres://u@" + quiet + "/db?sslmode=disable", "show", "x"}, 1, "timeout"},
		{"mysql refused", []string{"-backend", "mysql://u@" + refused + "/db", "-yes", "release", "x"}, 1, "connection refused"},
		{"mysql silent", []string{"-backend", "mysql://u@" + quiet + "/db", "list"}, 1, "no answer within 1s"},
		{"etcd refused", []string{"-backend", "etcd://" + refused + "/app/", "show", "x"}, 1, "connection refused"},
		{"etcd silent", []string{"-backend", "etcd://" + quiet, "list"}, 1, "no answer within 1s"},
		{"etcd -prefix", []string{"-backend", "etcd://" + refused, "-prefix", "app/", "list"}, 2, "etcd://host:2379/PREFIX"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := ctl(t, nil, append([]string{"-timeout", timeout.String()}, tt.args...)...)
			assert.Equal(t, tt.code, r.code, "stderr: %s", r.stderr)
			assert.Empty(t, r.stdout)
			assertOneLine(t, r.stderr, tt.want)
			assert.Less(t, r.took, timeout+5*time.Second, "bounded by -timeout (and the binary's start)")
		})
	}
}

// testWrongPassword runs list on the backend with a password of its own, which the server
// refuses or ignores: nothing the drivers and the stores say of it, on a real server, may
// show it.
func testWrongPassword(t *testing.T, fx fixture) {
	c, err := splitURL(fx.url)
	require.NoError(t, err)
	const pw = "Zq-wrong#/@:% pw"
	c.password, c.hasPassword, c.hasUser = pw, true, true
	if c.user == "" {
		c.user = "ops"
	}
	r := ctl(t, nil, append([]string{"-timeout", "2s", "-backend", c.render(false)}, append(fx.flags, "list")...)...)
	t.Logf("exit %d: %s", r.code, r.stderr)
	assertNoSecret(t, r.stdout+r.stderr, pw)
}
