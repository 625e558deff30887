package testserver

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// faultWait bounds how long a test waits for something a fault makes happen.
const faultWait = 10 * time.Second

// proxied starts a redis-server and a FaultProxy in front of it, and returns the proxy, a
// client through the proxy that never retries, and a client straight to the server.
func proxied(t *testing.T, opts *redis.Options) (*FaultProxy, *redis.Client, *redis.Client) {
	t.Helper()
	r := StartRedis(t)
	p := StartFaultProxy(t, r.Addr)
	if opts == nil {
		opts = &redis.Options{}
	}
	opts.Addr, opts.MaxRetries = p.Addr, -1
	via := redis.NewClient(opts)
	direct := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() {
		_ = via.Close()
		_ = direct.Close()
	})
	return p, via, direct
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(faultWait):
		t.Fatalf("%s did not happen within %v", what, faultWait)
	}
}

func TestFaultProxyRelays(t *testing.T) {
	p, via, direct := proxied(t, nil)
	big := strings.Repeat("x", 1<<20) // many chunks each way
	require.NoError(t, via.Set(t.Context(), "k", big, 0).Err())
	got, err := via.Get(t.Context(), "k").Result()
	require.NoError(t, err)
	assert.Equal(t, big, got)
	got, err = direct.Get(t.Context(), "k").Result()
	require.NoError(t, err)
	assert.Equal(t, big, got)

	s := p.Stats()
	assert.Equal(t, int64(1), s.Conns)
	assert.Equal(t, 1, s.Active)
	assert.Zero(t, s.Dropped+s.Delayed+s.Discarded+s.Refused+s.Reset)
}

// TestFaultProxyDropReply loses the reply of one INCR after the server ran it: the client
// gets an error, the counter went up anyway.
func TestFaultProxyDropReply(t *testing.T) {
	p, via, direct := proxied(t, nil)
	f := p.DropReply(MatchCommand("INCR", "counter"))

	require.NoError(t, via.Incr(t.Context(), "other").Err(), "a request that does not match")
	err := via.Incr(t.Context(), "counter").Err()
	require.Error(t, err, "the client got the reply")
	t.Logf("the client saw: %v", err)
	wait(t, f.Matched(), "the match")
	wait(t, f.Done(), "the drop")
	got, err := direct.Get(t.Context(), "counter").Result()
	require.NoError(t, err)
	assert.Equal(t, "1", got, "the server did not run the command")
	assert.Equal(t, int64(1), p.Stats().Dropped)

	n, err := via.Incr(t.Context(), "counter").Result()
	require.NoError(t, err, "the fault is one-shot")
	assert.Equal(t, int64(2), n)
}

// TestFaultProxyDelayReply holds the reply of one GET while other connections flow.
func TestFaultProxyDelayReply(t *testing.T) {
	const delay = time.Second
	p, slow, direct := proxied(t, &redis.Options{ReadTimeout: 5 * delay})
	other := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = other.Close() })
	require.NoError(t, direct.Set(t.Context(), "slow", "s", 0).Err())
	require.NoError(t, direct.Set(t.Context(), "fast", "f", 0).Err())

	f := p.DelayReply(MatchCommand("GET", "slow"), delay)
	type result struct {
		v   string
		err error
		d   time.Duration
	}
	slowDone := make(chan result, 1)
	start := time.Now()
	go func() {
		v, err := slow.Get(context.Background(), "slow").Result()
		slowDone <- result{v, err, time.Since(start)}
	}()
	wait(t, f.Matched(), "the match")

	for range 3 {
		v, err := other.Get(t.Context(), "fast").Result()
		require.NoError(t, err)
		assert.Equal(t, "f", v)
	}
	select {
	case r := <-slowDone:
		t.Fatalf("the delayed reply came before the other connection's three round trips: %+v", r)
	default:
	}

	r := <-slowDone
	require.NoError(t, r.err)
	assert.Equal(t, "s", r.v)
	assert.GreaterOrEqual(t, r.d, delay, "the reply was not held for the delay")
	wait(t, f.Done(), "the delayed reply")
	assert.Equal(t, int64(1), p.Stats().Delayed)

	// One-shot: the next one is not held (no upper bound asserted, only that it works).
	require.NoError(t, slow.Get(t.Context(), "slow").Err())
	assert.Equal(t, int64(1), p.Stats().Delayed)
}

func TestFaultProxyLatency(t *testing.T) {
	const d = 150 * time.Millisecond
	p, via, _ := proxied(t, nil)
	require.NoError(t, via.Ping(t.Context()).Err()) // connected

	tests := []struct {
		name               string
		toServer, toClient time.Duration
	}{
		{"to the server", d, 0},
		{"to the client", 0, d},
		{"both ways", d, d},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.SetLatency(tt.toServer, tt.toClient)
			t.Cleanup(func() { p.SetLatency(0, 0) })
			start := time.Now()
			require.NoError(t, via.Ping(t.Context()).Err())
			assert.GreaterOrEqual(t, time.Since(start), tt.toServer+tt.toClient)
		})
	}
}

// TestFaultProxyBlackhole partitions the client from the server: requests time out, on open
// and on new connections, and what was sent during the partition never arrives.
func TestFaultProxyBlackhole(t *testing.T) {
	p, via, direct := proxied(t, &redis.Options{ReadTimeout: 300 * time.Millisecond})
	require.NoError(t, via.Ping(t.Context()).Err())

	p.Blackhole()
	err := via.Incr(t.Context(), "lost").Err()
	var netErr net.Error
	require.ErrorAs(t, err, &netErr)
	assert.True(t, netErr.Timeout(), "want a timeout, got %v", err)

	fresh := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = fresh.Close() })
	err = fresh.Ping(t.Context()).Err()
	require.ErrorAs(t, err, &netErr, "a new connection got through")
	assert.True(t, netErr.Timeout(), "want a timeout, got %v", err)
	assert.Positive(t, p.Stats().Discarded)

	p.Heal()
	require.NoError(t, via.Ping(t.Context()).Err())
	require.NoError(t, fresh.Ping(t.Context()).Err())
	require.ErrorIs(t, direct.Get(t.Context(), "lost").Err(), redis.Nil, "a request sent during the partition arrived")
}

// TestFaultProxyHealResetsTornConns: a connection whose bytes a partition discarded is reset
// when it heals, not relayed on with a hole in its stream — the second of two pipelined
// PINGs, one lost and one sent after Heal, must not be answered on that connection.
func TestFaultProxyHealResetsTornConns(t *testing.T) {
	r := StartRedis(t)
	p := StartFaultProxy(t, r.Addr)
	torn := dial(t, p.Addr)
	idle := dial(t, p.Addr)
	ping := func(c net.Conn) (string, error) {
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(faultWait))
		return bufio.NewReader(c).ReadString('\n')
	}
	_, err := ping(idle)
	require.NoError(t, err)

	p.Blackhole()
	_, err = torn.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.Stats().Discarded > 0 }, faultWait, time.Millisecond)
	p.Heal()

	reply, err := ping(torn)
	require.Error(t, err, "the connection went on after a hole in its stream: %q", reply)
	assert.Equal(t, int64(1), p.Stats().Reset)
	reply, err = ping(idle)
	require.NoError(t, err, "a connection idle during the partition was cut")
	assert.Equal(t, "+PONG\r\n", reply)
}

// TestFaultProxyHealDuringTear: a Heal that runs while a connection is marking itself torn —
// after it found the partition, before Heal looked for torn connections — still has it reset
// (it stayed silent for good: the write went through, and no reply ever came).
func TestFaultProxyHealDuringTear(t *testing.T) {
	r := StartRedis(t)
	p := StartFaultProxy(t, r.Addr)
	conn := dial(t, p.Addr)
	healed := make(chan struct{})
	beforeTorn = func(fp *FaultProxy) {
		if fp == p {
			beforeTorn = nil // once; the only connection's reader runs it
			fp.Heal()
			close(healed)
		}
	}
	t.Cleanup(func() { beforeTorn = nil })

	p.Blackhole()
	_, err := conn.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	wait(t, healed, "the heal")
	_, _ = conn.Write([]byte("PING\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(faultWait))
	reply, err := bufio.NewReader(conn).ReadString('\n')
	require.Error(t, err, "a torn connection went on: %q", reply)
	var netErr net.Error
	if errors.As(err, &netErr) {
		assert.False(t, netErr.Timeout(), "the torn connection stayed silent instead of being reset")
	}
	// Counted just after the reset the client saw.
	assert.Eventually(t, func() bool { return p.Stats().Reset == 1 }, faultWait, time.Millisecond)
}

// TestFaultProxyBlackholeConns cuts off the connections of one client, recognised by the name
// it gives in its first request, and leaves the other client's alone.
func TestFaultProxyBlackholeConns(t *testing.T) {
	r := StartRedis(t)
	p := StartFaultProxy(t, r.Addr)
	client := func(name string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: p.Addr, ClientName: name, MaxRetries: -1,
			ReadTimeout: 300 * time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.Ping(t.Context()).Err())
		return c
	}
	cut, kept := client("cut-off"), client("kept")

	p.BlackholeConns(func(first []byte) bool { return strings.Contains(string(first), "cut-off") })
	var netErr net.Error
	err := cut.Incr(t.Context(), "lost").Err()
	require.ErrorAs(t, err, &netErr, "the chosen client's request got through")
	assert.True(t, netErr.Timeout(), "want a timeout, got %v", err)
	require.NoError(t, kept.Incr(t.Context(), "kept").Err(), "another client's request was cut")

	p.Heal()
	require.NoError(t, client("cut-off").Ping(t.Context()).Err())
	require.NoError(t, kept.Ping(t.Context()).Err())
}

// TestFaultProxyResetRefuse resets open connections, then refuses new ones until allowed.
func TestFaultProxyResetRefuse(t *testing.T) {
	p, via, _ := proxied(t, nil)
	conn := dial(t, p.Addr)
	rd := bufio.NewReader(conn)
	_, err := conn.Write([]byte(resp("PING")))
	require.NoError(t, err)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "+PONG\r\n", line)

	p.Reset()
	_, err = rd.ReadString('\n')
	require.ErrorIs(t, err, syscall.ECONNRESET)
	assert.Equal(t, int64(1), p.Stats().Reset)
	eventually(t, "the reset connection is still open", func(context.Context) error {
		if a := p.Stats().Active; a != 0 {
			return assert.AnError
		}
		return nil
	})

	p.Refuse()
	require.ErrorIs(t, dialAndRead(p.Addr), syscall.ECONNRESET)
	require.Error(t, via.Ping(t.Context()).Err())
	assert.GreaterOrEqual(t, p.Stats().Refused, int64(2))

	p.Allow()
	require.NoError(t, via.Ping(t.Context()).Err())
}

// TestFaultProxyServerGone shows a dead server through the proxy: new connections are reset.
func TestFaultProxyServerGone(t *testing.T) {
	r := StartRedis(t)
	p := StartFaultProxy(t, r.Addr)
	r.Kill()
	require.ErrorIs(t, dialAndRead(p.Addr), syscall.ECONNRESET)
}

// dial connects to addr, and closes the connection when the test ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// dialAndRead connects to addr and reads a line: the error of the dial (a reset can come
// before the dial completes) or of the read.
func dialAndRead(addr string) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = bufio.NewReader(conn).ReadString('\n')
	return err
}

// TestFaultProxyClose closes a proxy with connections open, one of them holding a delayed
// reply: every goroutine it started returns.
func TestFaultProxyClose(t *testing.T) {
	r := StartRedis(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := StartFaultProxy(t, r.Addr)
	f := p.DelayReply(MatchCommand("PING"), time.Hour)
	p.SetLatency(0, time.Hour)
	var conns []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", p.Addr)
		require.NoError(t, err)
		conns = append(conns, c)
		defer c.Close()
	}
	_, err := conns[0].Write([]byte(resp("PING")))
	require.NoError(t, err)
	wait(t, f.Matched(), "the match")
	eventually(t, "the connections are not all relayed", func(context.Context) error {
		if a := p.Stats().Active; a != len(conns) {
			return assert.AnError
		}
		return nil
	})

	p.Close()
	p.Close() // a second Close is harmless
	_, err = net.Dial("tcp", p.Addr)
	require.Error(t, err, "the proxy still listens")
	for _, c := range conns {
		_, err := bufio.NewReader(c).ReadString('\n')
		require.Error(t, err, "the proxy left a connection open")
	}
}
