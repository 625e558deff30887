package grpcguard_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/grpcguard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/redisstore"
)

// serverEnv, when set to a Redis address, makes the test binary a bank server on that Redis:
// a second process for TestTwoServerProcesses.
const serverEnv = "GRPCGUARD_TEST_REDIS"

func TestMain(m *testing.M) {
	if addr := os.Getenv(serverEnv); addr != "" {
		if err := serveProcess(addr); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func redisClient(tb testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// journal is what the handlers of every process write on Redis, to show the locks at work:
// how many run at once per name (in:NAME), the most that ever did (max:NAME), the last fence
// seen per name (fence:NAME) and how many fences went backwards (backwards).
const journalScript = `
local n = redis.call('INCR', KEYS[1])
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > m then redis.call('SET', KEYS[2], n) end
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[1]) <= last then redis.call('INCR', KEYS[4]) end
redis.call('SET', KEYS[3], ARGV[1])
return n`

// enter records a handler's start under a lock with fence; leave its end.
func enter(ctx context.Context, rdb *redis.Client, name string, fence uint64) error {
	return rdb.Eval(ctx, journalScript, []string{"in:" + name, "max:" + name, "fence:" + name, "backwards"}, fence).Err()
}

func leave(ctx context.Context, rdb *redis.Client, name string) error {
	return rdb.Decr(ctx, "in:"+name).Err()
}

// bankHandlers are the handlers of a server process: Withdraw locked per account, Audit (a
// stream) per tenant, each journaled.
func bankHandlers(b bank, rdb *redis.Client) *handlers {
	journaled := func(ctx context.Context, d time.Duration) error {
		l, ok := guard.FromContext(ctx)
		if !ok {
			return status.Error(codes.Internal, "no lock")
		}
		if err := enter(context.Background(), rdb, l.Name(), l.Fence()); err != nil {
			return err
		}
		time.Sleep(d)
		return leave(context.Background(), rdb, l.Name())
	}
	return &handlers{
		withdraw: func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
			if err := journaled(ctx, 2*time.Millisecond); err != nil {
				return nil, err
			}
			out := dynamicpb.NewMessage(b.accounts.Methods().ByName("Withdraw").Output())
			if l, ok := guard.FromContext(ctx); ok {
				out.Set(out.Descriptor().Fields().ByName("fence"), protoValueUint(l.Fence()))
			}
			return out, nil
		},
		audit: func(req *dynamicpb.Message, stream grpc.ServerStream) error {
			if err := journaled(stream.Context(), 3*time.Millisecond); err != nil {
				return err
			}
			return stream.SendMsg(dynamicpb.NewMessage(b.accounts.Methods().ByName("Audit").Output()))
		},
	}
}

// newBankServer builds the locked bank server of one process on Redis at addr.
func newBankServer(b bank, addr string) (*grpc.Server, func(), error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	g := guard.New(redisstore.New(rdb))
	ic, err := grpcguard.New(g, grpcguard.Files(b.files),
		grpcguard.Method(withdraw, "account:{account_id}", guard.WaitTime(10*time.Second)),
		grpcguard.Method(audit, "audit:{md.x-tenant}", guard.WaitTime(10*time.Second)))
	if err != nil {
		return nil, nil, err
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	b.register(s, bankHandlers(b, rdb))
	return s, func() {
		_ = g.Close(context.Background())
		_ = rdb.Close()
	}, nil
}

// serveProcess is the second server process: it prints its address and serves until its
// standard input closes.
func serveProcess(addr string) error {
	b := loadBank(&testing.T{})
	s, closeAll, err := newBankServer(b, addr)
	if err != nil {
		return err
	}
	defer closeAll()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		s.GracefulStop()
	}()
	fmt.Println("listening", lis.Addr())
	return s.Serve(lis)
}

// TestTwoServerProcesses: clients call a locked unary method and a locked stream on two
// server processes sharing one Redis, on few names: one handler per name at a time across
// both, fences increasing, and every call served.
func TestTwoServerProcesses(t *testing.T) {
	b := loadBank(t)
	srv := testserver.StartRedis(t)
	rdb := redisClient(t, srv.Addr)

	// This process's server.
	s, closeAll, err := newBankServer(b, srv.Addr)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-served
		closeAll()
	})

	// The other process's.
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), serverEnv+"="+srv.Addr)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	other, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	require.True(t, ok, "the server process said %q", line)

	var conns []*grpc.ClientConn
	for _, addr := range []string{lis.Addr().String(), other} {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		conns = append(conns, c)
	}

	const clients, calls = 8, 25
	var okCalls, failed atomic.Int64
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			conn := conns[i%2]
			for j := range calls {
				account := fmt.Sprintf(`{"account_id":"acct-%d"}`, j%2)
				out := b.message(t, "WithdrawReply", "")
				if err := conn.Invoke(t.Context(), withdraw, b.message(t, "WithdrawRequest", account), out); err != nil {
					failed.Add(1)
					t.Log(err)
					continue
				}
				ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", strconv.Itoa(j%2))
				st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, audit)
				if err == nil {
					err = st.SendMsg(b.message(t, "AuditRequest", `{}`))
				}
				if err == nil {
					err = st.CloseSend()
				}
				if err == nil {
					err = st.RecvMsg(b.message(t, "AuditEvent", ""))
				}
				if err != nil {
					failed.Add(1)
					t.Log(err)
					continue
				}
				okCalls.Add(2)
			}
		})
	}
	wg.Wait()
	assert.Zero(t, failed.Load())
	assert.EqualValues(t, 2*clients*calls, okCalls.Load())
	for _, name := range []string{"account:acct-0", "account:acct-1", "audit:0", "audit:1"} {
		most, err := rdb.Get(t.Context(), "max:"+name).Int()
		require.NoError(t, err, name)
		assert.Equal(t, 1, most, "handlers at once on %s", name)
	}
	backwards, err := rdb.Get(t.Context(), "backwards").Int()
	if err != redis.Nil {
		require.NoError(t, err)
	}
	assert.Zero(t, backwards, "fences that went backwards")
	t.Logf("%d calls over two processes on four names, one handler per name at a time", okCalls.Load())
}
