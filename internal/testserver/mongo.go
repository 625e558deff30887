package testserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// MongoURIEnv names the environment variable that points the tests at a real MongoDB server
// (a mongodb:// or mongodb+srv:// URI) instead of FerretDB.
const MongoURIEnv = "MONGODB_URI"

// FerretDBEnv names the environment variable that gives a prebuilt ferretdb binary (built
// from tools/ferretdb) instead of building one.
const FerretDBEnv = "GUARD_FERRETDB"

// mongoReadyTimeout bounds how long a server from MONGODB_URI may take to answer.
const mongoReadyTimeout = 30 * time.Second

// ferretdbHint tells how to get the FerretDB binary when it cannot be built.
const ferretdbHint = "build it by hand to see why: cd tools/ferretdb && go build " +
	"(it needs the Go module proxy, or a module cache that holds FerretDB v1.24.2); " +
	"then set " + FerretDBEnv + "=$PWD/ferretdb, or point " + MongoURIEnv + " at a real MongoDB"

// Mongo is a MongoDB-wire-protocol server for one test: FerretDB v1 with its SQLite backend,
// run as a child process behind a WireProxy, or the real MongoDB server that MONGODB_URI
// names.
//
// Why the proxy: FerretDB v1 does not make single-document writes atomic (see WireProxy), so
// two lock contenders could both take an expired lock through it, which MongoDB never allows.
// The tests of a lock backend must run against MongoDB's semantics, so they use URI, which
// goes through the proxy; RawURI reaches FerretDB directly and exists to show the race.
//
// FerretDB v1 also lacks TTL indexes, pipeline updates ($$NOW), change streams and
// transactions; code that the tests run on both servers must not depend on them.
type Mongo struct {
	// URI is the connection string the tests use: through the proxy for FerretDB, the value
	// of MONGODB_URI otherwise.
	URI string
	// RawURI reaches FerretDB without the proxy (equal to URI on a real server).
	RawURI string
	// Database is a database name no other test uses; it is dropped when the test ends on a
	// real server, and lives in the test's temporary directory on FerretDB.
	Database string
	// External reports that the server came from MONGODB_URI.
	External bool
	// Proxy is the proxy in front of FerretDB; nil on a real server.
	Proxy *WireProxy

	tb   testing.TB
	proc *Process
}

// StartMongo returns the server named by MONGODB_URI when that variable is set, and
// otherwise starts FerretDB as StartFerretDB does.
func StartMongo(tb testing.TB) *Mongo {
	tb.Helper()
	uri := os.Getenv(MongoURIEnv)
	if uri == "" {
		return StartFerretDB(tb)
	}
	m := &Mongo{URI: uri, RawURI: uri, Database: databaseName(tb), External: true, tb: tb}
	ctx, cancel := context.WithTimeout(context.Background(), mongoReadyTimeout)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(mongoReadyTimeout))
	if err != nil {
		tb.Fatalf("testserver: %s=%q: %v", MongoURIEnv, uri, err)
	}
	if err := client.Ping(ctx, nil); err != nil {
		_ = client.Disconnect(ctx)
		tb.Fatalf("testserver: %s=%q does not answer: %v", MongoURIEnv, uri, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), mongoReadyTimeout)
		defer cancel()
		if err := client.Database(m.Database).Drop(ctx); err != nil {
			tb.Errorf("testserver: drop database %s: %v", m.Database, err)
		}
		_ = client.Disconnect(ctx)
	})
	return m
}

// StartFerretDB starts FerretDB (built from tools/ferretdb once per test binary) on a free
// loopback port with its data in a temporary directory, and a WireProxy in front of it. Both
// stop when the test ends. Tests that kill the server use it even when MONGODB_URI is set.
func StartFerretDB(tb testing.TB) *Mongo {
	tb.Helper()
	bin := ferretdb.binary(tb)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
	proc := Start(tb, addr, ferretdbHint, bin, "-listen", addr, "-data", tb.TempDir())
	database := databaseName(tb)
	createDatabase(tb, "mongodb://"+addr+"/?directConnection=true", database)
	proxy := StartWireProxy(tb, addr)
	return &Mongo{
		URI:      "mongodb://" + proxy.Addr + "/?directConnection=true",
		RawURI:   "mongodb://" + addr + "/?directConnection=true",
		Database: database,
		Proxy:    proxy,
		tb:       tb,
		proc:     proc,
	}
}

// createDatabase makes database on the server at uri with one write. FerretDB makes a
// database's SQLite file and its metadata table on its first write: a SIGKILL in between left a
// file that a restarted FerretDB refuses ("no such table: _ferretdb_collections"), which a
// chaos run's first crash once hit. Made here, the database exists before any test kills the
// server.
func createDatabase(tb testing.TB, uri, database string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), mongoReadyTimeout)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(mongoReadyTimeout))
	if err != nil {
		tb.Fatalf("testserver: FerretDB at %s: %v", uri, err)
	}
	defer func() { _ = client.Disconnect(ctx) }()
	if _, err := client.Database(database).Collection("testserver").InsertOne(ctx, map[string]any{"ready": true}); err != nil {
		tb.Fatalf("testserver: FerretDB at %s: create database %s: %v", uri, database, err)
	}
}

// Kill stops FerretDB with SIGKILL and closes the proxy, as a crashed server: open connections
// break and new ones are refused. It fails the test on a server from MONGODB_URI, which the
// test cannot kill.
func (m *Mongo) Kill() {
	if m.External {
		m.tb.Fatalf("testserver: cannot kill the server of %s; crash tests use StartFerretDB", MongoURIEnv)
	}
	m.proc.Kill()
	for _, err := range m.Proxy.Close() {
		m.tb.Errorf("testserver: wire proxy: %v", err)
	}
}

// Output is what FerretDB printed so far ("" on a real server).
func (m *Mongo) Output() string {
	if m.proc == nil {
		return ""
	}
	return m.proc.Output()
}

// databaseName returns a database name no other test uses: a prefix, the test's name reduced
// to letters, digits and '_', and a random suffix, within MongoDB's 63-byte limit.
func databaseName(tb testing.TB) string {
	var b strings.Builder
	for _, r := range tb.Name() {
		if b.Len() >= 32 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	return "guard_" + b.String() + "_" + hex.EncodeToString(suffix[:])
}

// ferretdb is the FerretDB server of tools/ferretdb.
var ferretdb = &tool{
	name:    "ferretdb",
	pkg:     ".",
	sources: []string{"go.mod", "go.sum", "main.go"},
	env:     FerretDBEnv,
	hint:    ferretdbHint,
	timeout: 10 * time.Minute,
}
