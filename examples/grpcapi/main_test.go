package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/guardlock/guard/examples/grpcapi/bankpb"
)

// TestInProcess runs the service on the embedded backend: deposits and withdrawals from
// concurrent clients on one account add up, and an overdraft is refused.
func TestInProcess(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-work", "1ms"}, slog.New(slog.NewTextHandler(io.Discard, nil)),
			func(a net.Addr) { addrs <- a })
	}()
	c := client(t, (<-addrs).String())
	exercise(t, []bankpb.AccountsClient{c})
	_, err := c.Withdraw(t.Context(), &bankpb.MoveRequest{AccountId: "a", Amount: 1 << 40})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	cancel()
	require.NoError(t, <-done)
}

// TestTwoProcesses runs two copies of the program on one Redis; clients of both move money
// on one account: every change is applied once, under its own fence, and the balance adds up.
func TestTwoProcesses(t *testing.T) {
	redisAddr := startRedis(t)
	bin := filepath.Join(t.TempDir(), "grpcapi")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	listening := regexp.MustCompile(`addr=(\S+)`)
	var clients []bankpb.AccountsClient
	for range 2 {
		cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-redis", redisAddr, "-work", "2ms", "-wait", "20s")
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
		})
		sc := bufio.NewScanner(stderr)
		require.True(t, sc.Scan(), "the program said nothing")
		m := listening.FindStringSubmatch(sc.Text())
		require.NotNil(t, m, "the program said %q", sc.Text())
		go func() { _, _ = io.Copy(io.Discard, stderr) }()
		clients = append(clients, client(t, m[1]))
	}
	exercise(t, clients)
}

func client(t *testing.T, addr string) bankpb.AccountsClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return bankpb.NewAccountsClient(conn)
}

// exercise deposits 10 a hundred times and withdraws 7 a hundred times on one account,
// through the clients in turn, eight calls at a time, and checks the balance and the fences.
func exercise(t *testing.T, clients []bankpb.AccountsClient) {
	const calls = 100
	account := fmt.Sprintf("acct-%d", time.Now().UnixNano())
	_, err := clients[0].Deposit(t.Context(), &bankpb.MoveRequest{AccountId: account, Amount: 700})
	require.NoError(t, err)
	var mu sync.Mutex
	fences := make(map[uint64]bool)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range 2 * calls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c := clients[i%len(clients)]
			move := c.Deposit
			amount := int64(10)
			if i%2 == 1 {
				move, amount = c.Withdraw, 7
			}
			r, err := move(t.Context(), &bankpb.MoveRequest{AccountId: account, Amount: amount})
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			assert.False(t, fences[r.GetFence()], "fence %d given twice", r.GetFence())
			fences[r.GetFence()] = true
			mu.Unlock()
		})
	}
	wg.Wait()
	got, err := clients[len(clients)-1].Get(t.Context(), &bankpb.GetRequest{AccountId: account})
	require.NoError(t, err)
	assert.EqualValues(t, 700+calls*10-calls*7, got.GetBalance(), "changes lost or applied twice")
}

// startRedis starts a redis-server of its own on a free loopback port, in a temporary
// directory, without persistence, and stops it when the test ends.
func startRedis(t *testing.T) string {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("this test runs redis-server, which is not installed: apt-get install redis-server (%v)", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := lis.Addr().(*net.TCPAddr).Port
	require.NoError(t, lis.Close())
	cmd := exec.Command(path, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			return addr
		}
	}
	t.Fatalf("redis-server did not listen on %s", addr)
	return ""
}
