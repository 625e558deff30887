// Command etcd runs an etcd server (go.etcd.io/etcd/server/v3, the same code as the etcd
// release binary) for the guard test suite: internal/testserver builds it once per test binary
// and starts it as child processes on free loopback ports — one member, or a cluster of three.
// It takes etcd's own flags.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
