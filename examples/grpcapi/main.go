// Command grpcapi is a small gRPC account service whose deposits and withdrawals each hold a
// distributed lock on their account, declared once with package grpcguard's interceptors
// instead of inside every handler:
//
//	grpcguard.Method("/bank.v1.Accounts/Withdraw", "account:{account_id}", guard.WaitTime(wait))
//
// It runs on the embedded in-process backend, or on Redis shared by several instances; the
// balances live where the locks do (memory, or a hash per account on Redis), and every write
// carries the lock's fence, so that a write from a holder that lost its lock is refused:
//
//	go run .                        # in-process backend, listens on 127.0.0.1:9090
//	go run . -redis 127.0.0.1:6379  # or GUARD_REDIS_ADDR; run two with -addr 127.0.0.1:9091
//
// Call it with any gRPC client, grpcurl for one (the server has reflection off; pass the
// proto file):
//
//	grpcurl -plaintext -proto bankpb/bank.proto -d '{"account_id":"42","amount":100}' 127.0.0.1:9090 bank.v1.Accounts/Deposit
//	grpcurl -plaintext -proto bankpb/bank.proto -d '{"account_id":"42","amount":30}' 127.0.0.1:9090 bank.v1.Accounts/Withdraw
//	grpcurl -plaintext -proto bankpb/bank.proto -H 'x-tenant: acme' 127.0.0.1:9090 bank.v1.Accounts/Export
//
// A call whose account another call holds waits up to -wait, then gets Aborted with a
// RetryInfo; an overdraft is FailedPrecondition. SIGINT or SIGTERM stops it gracefully.
//
// The program imports only guard's public packages and its own bankpb, and its tests start
// their own redis-server: copy the directory into a module of yours and change that one import
// path (and bank.proto's go_package, to regenerate the code).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/examples/grpcapi/bankpb"
	"github.com/guardlock/guard/grpcguard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/redisstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := run(ctx, os.Args[1:], log, nil)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		log.Error(err.Error())
		os.Exit(1)
	}
}

// run serves until ctx ends. It calls ready, when not nil, with the address it listens on.
func run(ctx context.Context, args []string, log *slog.Logger, ready func(net.Addr)) error {
	fs := flag.NewFlagSet("grpcapi", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9090", "listen on `host:port`")
	redisAddr := fs.String("redis", os.Getenv("GUARD_REDIS_ADDR"), "Redis `host:port` for the locks and the balances (default: in-process)")
	wait := fs.Duration("wait", 2*time.Second, "how long a deposit or withdrawal waits for its account's lock")
	work := fs.Duration("work", 20*time.Millisecond, "how long a deposit or withdrawal takes between reading and writing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	var backend guard.Backend
	var store balances
	if *redisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
		defer rdb.Close()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis %s: %w", *redisAddr, err)
		}
		backend, store = redisstore.New(rdb), &redisBalances{rdb: rdb}
	} else {
		backend, store = memstore.New(), newMemBalances()
	}
	g := guard.New(backend)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Close(ctx)
	}()

	locks, err := grpcguard.New(g,
		grpcguard.Method(bankpb.Accounts_Deposit_FullMethodName, "account:{account_id}", guard.WaitTime(*wait)),
		grpcguard.Method(bankpb.Accounts_Withdraw_FullMethodName, "account:{account_id}", guard.WaitTime(*wait)),
		grpcguard.Method(bankpb.Accounts_Export_FullMethodName, "export:{md.x-tenant}", grpcguard.Permits(2)),
	)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(locks.Unary()), grpc.ChainStreamInterceptor(locks.Stream()))
	bankpb.RegisterAccountsServer(srv, &accounts{store: store, work: *work})

	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	log.Info("listening", "addr", lis.Addr().String(), "backend", map[bool]string{true: "redis", false: "in-process"}[*redisAddr != ""])
	if ready != nil {
		ready(lis.Addr())
	}
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	return srv.Serve(lis)
}
