package testserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EtcdEnv names an environment variable that may hold the path of an etcd binary to use
// instead of building tools/etcd.
const EtcdEnv = "GUARD_ETCD"

const etcdHint = "the tests build it from tools/etcd (go.etcd.io/etcd/server/v3, from the Go module proxy): " +
	"run `cd tools/etcd && go build .` to see why that failed, or set " + EtcdEnv + " to an etcd binary"

var etcd = &tool{
	name:    "etcd",
	pkg:     ".",
	sources: []string{"go.mod", "go.sum", "main.go"},
	env:     EtcdEnv,
	hint:    etcdHint,
	timeout: 15 * time.Minute,
}

// EtcdBinary returns the path of the etcd program the tests start (built from tools/etcd, or
// the one EtcdEnv names), for a test that hands it to another program's tests.
func EtcdBinary(tb testing.TB) string {
	tb.Helper()
	return etcd.binary(tb)
}

// Timing of the test members: etcd's defaults (a heartbeat every 100 ms, an election after
// 1 s without one), so that failovers take as long as they do in production. With them the
// server's shortest lease is 2 s: ⌈3/2 election ticks × heartbeat⌉.
const (
	EtcdHeartbeat       = 100 * time.Millisecond
	EtcdElectionTimeout = time.Second
)

// EtcdCluster is one etcd member or a cluster of them, running as child processes of the
// test. Clients reach each member through a FaultProxy of its own (Endpoints), and members
// reach each other through another one per member, so that a test can cut a member off from
// its clients, from its peers, or both.
type EtcdCluster struct {
	Members []*EtcdMember
}

// EtcdMember is one etcd server of an EtcdCluster.
type EtcdMember struct {
	*Process // the server; Addr is its client address, without a proxy (Kill, Restart, Pause…)

	Name string
	Dir  string // its data directory
	// Client is the FaultProxy that clients dial (Endpoint); Peer the one its peers dial.
	Client, Peer *FaultProxy

	cluster *EtcdCluster
}

// Endpoint returns the address clients dial to reach m: its client FaultProxy.
func (m *EtcdMember) Endpoint() string { return m.Client.Addr }

// Endpoints returns the addresses clients dial, one per member.
func (c *EtcdCluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, m := range c.Members {
		eps[i] = m.Endpoint()
	}
	return eps
}

// StartEtcd starts a single etcd member on free loopback ports, in a temporary directory, and
// waits until it serves. It is killed when the test ends.
func StartEtcd(tb testing.TB) *EtcdCluster { return StartEtcdCluster(tb, 1) }

// StartEtcdCluster starts a cluster of n etcd members (three for a cluster that survives the
// loss of one) on free loopback ports, each in a temporary directory of its own, and waits
// until every member serves and they agree on a leader. They are killed when the test ends.
// A port taken by another process between its choice and etcd's bind (tests of other packages
// pick free ports at the same time) makes it start the cluster again on new ports, up to three
// times in all.
func StartEtcdCluster(tb testing.TB, n int) *EtcdCluster {
	tb.Helper()
	for attempt := 1; ; attempt++ {
		c := newEtcdCluster(tb, n)
		// The members of a new cluster wait for each other: start them all, then wait.
		for _, m := range c.Members {
			m.launch(tb)
		}
		var err error
		for _, m := range c.Members {
			if err = m.healthy(); err != nil {
				break
			}
		}
		if err == nil {
			c.Leader(tb)
			return c
		}
		if attempt == 3 || !c.portTaken() {
			tb.Fatal(err)
		}
		tb.Logf("testserver: etcd could not bind a port chosen for it; starting the cluster again on new ports")
		for _, m := range c.Members {
			m.Kill()
			m.Client.Close()
			m.Peer.Close()
			_ = os.RemoveAll(m.Dir) // etcd sets 64 MB aside for each member's log
		}
	}
}

// etcdPortChosen, when set, hears each member's client address once it is chosen: tests take
// one of them to show what a port taken before etcd binds it does.
var etcdPortChosen func(addr string)

// portTaken reports whether a member exited because its port was taken.
func (c *EtcdCluster) portTaken() bool {
	for _, m := range c.Members {
		if m.Exited() && strings.Contains(m.Output(), "address already in use") {
			return true
		}
	}
	return false
}

// newEtcdCluster makes the members of a new cluster of n on free ports, not started.
func newEtcdCluster(tb testing.TB, n int) *EtcdCluster {
	tb.Helper()
	bin := etcd.binary(tb)
	c := &EtcdCluster{}
	var initial []string
	for i := range n {
		m := &EtcdMember{Name: "m" + strconv.Itoa(i), Dir: filepath.Join(tb.TempDir(), "data"), cluster: c}
		m.Process = &Process{Name: "etcd " + m.Name, Addr: loopback(tb)}
		if etcdPortChosen != nil {
			etcdPortChosen(m.Addr)
		}
		m.Client = StartFaultProxy(tb, m.Addr)
		peer := loopback(tb)
		m.Peer = StartFaultProxy(tb, peer)
		m.args = []string{
			"--name", m.Name, "--data-dir", m.Dir,
			"--listen-client-urls", "http://" + m.Addr, "--advertise-client-urls", "http://" + m.Client.Addr,
			"--listen-peer-urls", "http://" + peer, "--initial-advertise-peer-urls", "http://" + m.Peer.Addr,
			"--heartbeat-interval", strconv.Itoa(int(EtcdHeartbeat / time.Millisecond)),
			"--election-timeout", strconv.Itoa(int(EtcdElectionTimeout / time.Millisecond)),
			"--initial-cluster-token", "guard-test", "--initial-cluster-state", "new",
			"--log-level", "warn", "--listen-metrics-urls", "",
		}
		initial = append(initial, m.Name+"=http://"+m.Peer.Addr)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.args = append(m.args, "--initial-cluster", strings.Join(initial, ","))
		m.path, m.out = bin, &syncBuffer{}
		tb.Cleanup(m.Kill)
	}
	return c
}

// loopback returns a free loopback address.
func loopback(tb testing.TB) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
}

// launch starts the member's process without waiting for it to listen.
func (m *EtcdMember) launch(tb testing.TB) {
	tb.Helper()
	r := &run{done: make(chan struct{})}
	r.cmd = exec.Command(m.path, m.args...)
	r.cmd.Stdout, r.cmd.Stderr = m.out, m.out
	if err := r.cmd.Start(); err != nil {
		tb.Fatalf("testserver: start %s: %v", m.Name, err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	m.mu.Lock()
	m.run, m.paused = r, false
	m.mu.Unlock()
}

// Restart kills the member (SIGKILL) if it runs and starts it again with its data directory,
// so it rejoins its cluster with what it had made durable, and waits until it serves.
func (m *EtcdMember) Restart(tb testing.TB) {
	tb.Helper()
	m.Kill()
	m.launch(tb)
	m.waitHealthy(tb)
}

// RestartAll kills every member (SIGKILL) and starts them all again with their data: a
// cluster-wide crash, a power cut. It waits until they serve and agree on a leader.
func (c *EtcdCluster) RestartAll(tb testing.TB) {
	tb.Helper()
	for _, m := range c.Members {
		m.Kill()
	}
	for _, m := range c.Members {
		m.launch(tb)
	}
	for _, m := range c.Members {
		m.waitHealthy(tb)
	}
	c.Leader(tb)
}

// waitHealthy waits until the member answers /health with a leader.
func (m *EtcdMember) waitHealthy(tb testing.TB) {
	tb.Helper()
	if err := m.healthy(); err != nil {
		tb.Fatal(err)
	}
}

// healthy waits until the member answers /health with a leader. It gives up after
// readyTimeout or when the member exits, with an error that shows the cluster's output.
func (m *EtcdMember) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	err := poll(ctx, 20*time.Millisecond, func() error {
		if m.Exited() {
			return errExited
		}
		var h struct{ Health string }
		if err := etcdGet(ctx, m.Addr, "/health", &h); err != nil {
			return err
		}
		if h.Health != "true" {
			return fmt.Errorf("health %q", h.Health)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testserver: %s on %s is not healthy: %w\n%s\n%s", m.Name, m.Addr, err, m.Output(), m.cluster.others(m))
	}
	return nil
}

// others describes the members other than m, for a failure message: whether each runs, and
// the end of its output (a member that cannot rejoin is often waiting for one of them).
func (c *EtcdCluster) others(m *EtcdMember) string {
	var b strings.Builder
	for _, o := range c.Members {
		if o == m {
			continue
		}
		state := "running"
		if r := o.current(); r == nil {
			state = "never started"
		} else if o.Exited() {
			state = fmt.Sprintf("exited (%v)", r.err)
		} else if o.isPaused() {
			state = "paused"
		}
		out := o.Output()
		if len(out) > 4000 {
			out = "…" + out[len(out)-4000:]
		}
		fmt.Fprintf(&b, "--- %s (%s): %s\n%s\n", o.Name, o.Addr, state, out)
	}
	return b.String()
}

// EtcdStatus is what a member says of itself and its cluster.
type EtcdStatus struct {
	ID, Leader uint64 // the member's ID, and the leader's as the member knows it (0: none)
	Revision   int64  // the revision of its store
	RaftTerm   uint64
}

// Status asks the member for its status, through its client address (not the proxy).
func (m *EtcdMember) Status(ctx context.Context) (EtcdStatus, error) {
	var s struct {
		Header struct {
			MemberID uint64 `json:"member_id,string"`
			Revision int64  `json:"revision,string"`
			RaftTerm uint64 `json:"raft_term,string"`
		}
		Leader uint64 `json:"leader,string"`
	}
	if err := etcdPost(ctx, m.Addr, "/v3/maintenance/status", struct{}{}, &s); err != nil {
		return EtcdStatus{}, err
	}
	return EtcdStatus{ID: s.Header.MemberID, Leader: s.Leader, Revision: s.Header.Revision, RaftTerm: s.Header.RaftTerm}, nil
}

// Leader waits until the running members agree on a leader among them, and returns it.
func (c *EtcdCluster) Leader(tb testing.TB) *EtcdMember {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var leader *EtcdMember
	err := poll(ctx, 20*time.Millisecond, func() error {
		leader = nil
		ids := make(map[uint64]*EtcdMember)
		var seen []uint64
		for _, m := range c.Members {
			if m.Exited() || m.isPaused() {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			s, err := m.Status(sctx)
			cancel()
			if err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			ids[s.ID] = m
			seen = append(seen, s.Leader)
		}
		for _, l := range seen {
			if l == 0 || l != seen[0] {
				return fmt.Errorf("no agreed leader: %v", seen)
			}
		}
		if len(seen) == 0 {
			return fmt.Errorf("no member runs")
		}
		if leader = ids[seen[0]]; leader == nil {
			return fmt.Errorf("the leader %x is not among the running members", seen[0])
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("testserver: etcd: %v", err)
	}
	return leader
}

// Isolate partitions m from its peers' raft traffic, until Rejoin: nothing reaches m on its
// peer port, and on the others' only the connections m's raft transport opens are cut (they
// name it in X-Server-From). m's other peer requests — a follower forwarding its clients'
// lease renewals to the leader, hash checks — still get through, so isolate a leader, as the
// tests do. Its clients still reach it (cut them off with m.Client.Blackhole). A leader cut off so steps down once it misses a quorum for an election
// timeout, and the others elect a new one.
func (m *EtcdMember) Isolate(tb testing.TB) {
	tb.Helper()
	s, err := m.Status(context.Background())
	if err != nil {
		tb.Fatalf("testserver: isolate %s: %v", m.Name, err)
	}
	// rafthttp names the sending member in every request it opens a connection with.
	from := []byte("X-Server-From: " + strconv.FormatUint(s.ID, 16) + "\r\n")
	m.Peer.Blackhole()
	for _, o := range m.cluster.Members {
		if o != m {
			o.Peer.BlackholeConns(func(first []byte) bool { return bytes.Contains(first, from) })
		}
	}
}

// Rejoin ends Isolate.
func (m *EtcdMember) Rejoin() {
	for _, o := range m.cluster.Members {
		o.Peer.Heal()
	}
}

// etcdGet GETs path from the member at addr and decodes its JSON answer into v.
func etcdGet(ctx context.Context, addr, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	return etcdDo(req, v)
}

// etcdPost POSTs body as JSON to the gRPC gateway of the member at addr and decodes its answer
// into v.
func etcdPost(ctx context.Context, addr, path string, body, v any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return etcdDo(req, v)
}

func etcdDo(req *http.Request, v any) error {
	resp, err := etcdHTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, v)
}

// etcdHTTP is the client of the helpers' own checks: no connection kept, so that a member's
// restart or pause never leaves one behind.
var etcdHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
