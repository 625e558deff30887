// Command ferretdb runs FerretDB v1 (embedded, SQLite backend) on one TCP address, for the
// guard test suite: internal/testserver builds it once per test binary and starts it as a
// child process on a free loopback port.
//
// FerretDB's own cmd/ferretdb cannot be built with a plain `go build` from the module cache
// (it panics on a version file that its build scripts generate), hence this small main around
// the embeddable github.com/FerretDB/FerretDB/ferretdb package.
//
// Usage:
//
//	ferretdb -listen 127.0.0.1:27017 [-data DIR] [-synchronous OFF|NORMAL|FULL]
//
// Without -data the databases live in a temporary directory that is removed when the process
// exits on SIGINT or SIGTERM (not on SIGKILL: pass -data to put it where a test cleans up).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:27017", "TCP `address` to listen on")
	data := flag.String("data", "", "`directory` for the SQLite databases (default: a temporary directory)")
	syncMode := flag.String("synchronous", "OFF", "SQLite synchronous `mode`: OFF skips fsync (test data survives "+
		"a killed server, not a crashed host); FULL is SQLite's default")
	flag.Parse()

	if err := run(*listen, *data, *syncMode); err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
}

func run(listen, data, synchronous string) error {
	if data == "" {
		dir, err := os.MkdirTemp("", "ferretdb-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		data = dir
	}
	abs, err := filepath.Abs(data)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	f, err := ferretdb.New(&ferretdb.Config{
		Listener: ferretdb.ListenerConfig{TCP: listen},
		Logger:   logger,
		Handler:  "sqlite",
		// FerretDB wants a directory URI, and it must end with a slash. It adds its own
		// pragmas (WAL journal, busy timeout) to ours.
		SQLiteURL: "file:" + filepath.ToSlash(abs) + "/?" + url.Values{
			"_pragma": {"synchronous(" + synchronous + ")"},
		}.Encode(),
	})
	if err != nil {
		return err
	}
	return f.Run(ctx)
}
