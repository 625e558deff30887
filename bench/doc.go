// Package bench compares guard's Redis backend with other Go Redis lock libraries —
// github.com/bsm/redislock and github.com/go-redsync/redsync — side by side in one run, on
// one redis-server that the benchmark starts; and guard's stores with each other
// (BenchmarkStores, and TestCharts), each on a server of its kind that the run starts. It is a
// module of its own so that the library's go.mod never names the libraries it is compared
// with, nor the etcd client.
//
//	cd bench && go test -run '^$' -bench . -benchtime 2000x
//
// Each benchmark reports ns/op, allocations and roundtrips/op: on Redis, the commands and
// pipelines the clients sent, counted by a go-redis hook; on the other stores, as
// stores_test.go says for each.
package bench
