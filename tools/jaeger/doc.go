// Package jaeger pins the Jaeger that guard's tests export spans to: Jaeger v2
// (github.com/jaegertracing/jaeger/cmd/jaeger at v1.76.0), declared as a tool of this module so
// that its whole dependency graph is locked in this go.sum and stays out of guard's.
//
// internal/testserver builds it once into the user cache directory (guard-tools/jaeger-KEY,
// keyed by this go.mod, go.sum and the Go version) and runs it with in-memory storage on free
// loopback ports. To build it by hand:
//
//	cd tools/jaeger && go build -o jaeger github.com/jaegertracing/jaeger/cmd/jaeger
//
// and point GUARD_JAEGER at the binary, or run it with `go tool jaeger`. A cold build
// downloads about 120 MB of modules. The UI's assets are not part of the module: the query API
// answers, the UI page does not.
package jaeger
