package mongostore_test

import (
	"context"
	"net/url"
	"testing"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/holdertest"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/mongostore"
)

// holderConn is the connection string of a holder process (holdertest) on srv: its URI and
// its database, as a query string.
func holderConn(srv *testserver.Mongo) string {
	return url.Values{"uri": {srv.URI}, "db": {srv.Database}}.Encode()
}

// openHolder opens the Store of a holder process from holderConn's string.
func openHolder(conn string) (guard.Backend, func(), error) {
	v, err := url.ParseQuery(conn)
	if err != nil {
		return nil, nil, err
	}
	mc, err := mongo.Connect(options.Client().ApplyURI(v.Get("uri")))
	if err != nil {
		return nil, nil, err
	}
	return mongostore.New(mc.Database(v.Get("db")).Collection(collName)),
		func() { _ = mc.Disconnect(context.Background()) }, nil
}

// TestPausedHolder: a holder process paused past its lease loses the lock to the next, whose
// fence is higher, and its late release frees nothing (holdertest.Paused).
func TestPausedHolder(t *testing.T) {
	srv := testserver.StartMongo(t)
	holdertest.Paused(t, holderConn(srv), func(t *testing.T) *guard.Guard { return guardOn(t, srv) })
}

// TestKilledHolder: a waiter takes the lock of a holder process killed without a release
// once its lease runs out (holdertest.Killed).
func TestKilledHolder(t *testing.T) {
	srv := testserver.StartMongo(t)
	holdertest.Killed(t, holderConn(srv), func(t *testing.T) *guard.Guard { return guardOn(t, srv) })
}

// guardOn returns a Guard with a client of its own on srv, closed when the test ends.
func guardOn(t *testing.T, srv *testserver.Mongo) *guard.Guard {
	g := guard.New(newClient(t, srv).store)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}
