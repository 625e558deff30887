package etcdstore

import (
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/chaos"
)

// TestMain runs the tests — or, in a process the chaos run started as one of its workers (this
// test binary again), that worker instead. The Store starts goroutines (its session, janitor
// and watches): none may outlive a test, nor a worker.
func TestMain(m *testing.M) {
	chaos.RegisterKind("etcd", openChaos)
	if ran, err := chaos.WorkerMain(); ran {
		if err == nil {
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// openChaos opens a chaos worker's Store on the endpoints of c.
func openChaos(c chaos.Conn) (guard.Backend, func(), error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Addrs, DialTimeout: time.Second,
		DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, nil, err
	}
	s := New(cli, WithRequestTimeout(2*time.Second))
	return s, func() {
		_ = s.Close()
		_ = cli.Close()
	}, nil
}
