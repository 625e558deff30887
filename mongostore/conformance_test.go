package mongostore_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
)

// TestConformance runs the backend conformance suite on one shared server: FerretDB behind
// the atomicity proxy, or the MongoDB server of MONGODB_URI. A round trip is one command
// (a driver CommandStartedEvent); each backend measures the server's clock before the suite
// counts, so the counts are the lock operations' own.
func TestConformance(t *testing.T) {
	locktest.Run(t, harness(t, testserver.StartMongo(t)))
}

// BenchmarkConformance runs the backend benchmarks of the suite.
func BenchmarkConformance(b *testing.B) {
	locktest.Bench(b, harness(b, testserver.StartMongo(b)))
}

// harness returns the conformance harness on srv. Every backend has a client of its own;
// Delete and Overwrite go behind their backs through another client.
//
// Each test of the suite (TestConformance/X, or X/Y, and the subtests below) has a collection
// of its own:
// FerretDB looks a document up by its _id index only for a filter that is {_id} alone, and
// scans the whole collection for the conditional updates of every lock operation, so the
// thousand locks that Inspect/List leaves would slow every test after it on a loaded
// machine. MongoDB serves every one of these filters from the _id index.
func harness(tb testing.TB, srv *testserver.Mongo) locktest.Harness {
	admin := newClient(tb, srv).coll.Database()
	coll := func(tb testing.TB) string {
		parts := strings.SplitN(tb.Name(), "/", 4)
		if len(parts) < 2 {
			return collName
		}
		var b strings.Builder
		b.WriteString(collName + "_")
		for _, r := range strings.Join(parts[1:min(len(parts), 3)], "_") {
			if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' {
				b.WriteRune(r)
			}
		}
		return b.String()
	}
	return locktest.Harness{
		New: func(tb testing.TB) locktest.Target {
			c := newClientOn(tb, srv, coll(tb))
			return locktest.Target{Backend: c.store, RoundTrips: c.cmds.total.Load}
		},
		Delete: func(tb testing.TB, name string) {
			res, err := admin.Collection(coll(tb)).DeleteOne(tb.Context(), bson.D{{Key: "_id", Value: name}})
			require.NoError(tb, err)
			require.EqualValues(tb, 1, res.DeletedCount, "no lock %q to delete", name)
		},
		Overwrite: func(tb testing.TB, name string) {
			// The intruder keeps the holder's lease, as if it had taken the name at its end.
			res, err := admin.Collection(coll(tb)).UpdateOne(tb.Context(), bson.D{{Key: "_id", Value: name}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: "intruder"}}}})
			require.NoError(tb, err)
			require.EqualValues(tb, 1, res.MatchedCount, "no lock %q to overwrite", name)
		},
		Wipe: func(tb testing.TB) {
			_, err := admin.Collection(coll(tb)).DeleteMany(tb.Context(), bson.D{})
			require.NoError(tb, err)
		},
		Killable: func(tb testing.TB) (locktest.Target, func()) {
			// A dedicated FerretDB even when MONGODB_URI is set: that server cannot be killed.
			dedicated := testserver.StartFerretDB(tb)
			c := newClient(tb, dedicated)
			return locktest.Target{Backend: c.store, RoundTrips: c.cmds.total.Load}, dedicated.Kill
		},
	}
}
