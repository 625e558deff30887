package testserver

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

func connect(t *testing.T, uri string, opts ...*options.ClientOptions) *mongo.Client {
	t.Helper()
	o := options.Client().ApplyURI(uri).SetMaxPoolSize(32)
	client, err := mongo.Connect(append([]*options.ClientOptions{o}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return client
}

func TestStartMongo(t *testing.T) {
	m := StartMongo(t)
	ctx := t.Context()
	for _, uri := range []string{m.URI, m.RawURI} {
		var hello bson.M
		err := connect(t, uri).Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello)
		require.NoError(t, err, uri)
		assert.Contains(t, hello, "localTime", "the store's clock estimate needs hello.localTime")
		t.Logf("%s: maxWireVersion %v", uri, hello["maxWireVersion"])
	}
	assert.NotEmpty(t, m.Database)
	assert.NotEqual(t, m.Database, databaseName(t), "database names must differ")
}

func TestFerretDBKill(t *testing.T) {
	m := StartFerretDB(t)
	client := connect(t, m.URI, options.Client().SetServerSelectionTimeout(500*time.Millisecond))
	ctx := t.Context()
	require.NoError(t, client.Ping(ctx, nil))
	m.Kill()
	err := client.Ping(ctx, nil)
	require.Error(t, err, "ping after Kill")
}

// TestFerretDBRace shows why the tests reach FerretDB through the WireProxy. In every round
// racers goroutines, all released at once, try to take over one expired lock document with the
// same single conditional upsert that a lock backend uses to acquire: match the document only
// while it is expired, then set a new owner. MongoDB applies a single-document write
// atomically, so exactly one racer may win; the others find the document no longer expired,
// try to insert it and get a duplicate-key error.
//
// FerretDB v1 evaluates the filter and applies the update as two steps, so several racers
// match the same expired document and all "win": without the proxy, some round has more than
// one winner. Through the proxy, which lets one write command into the server at a time,
// every round has exactly one.
func TestFerretDBRace(t *testing.T) {
	if testing.Short() {
		t.Skip("race rounds take a few seconds")
	}
	m := StartFerretDB(t)
	const racers = 8

	t.Run("Raw", func(t *testing.T) {
		coll := connect(t, m.RawURI).Database(m.Database).Collection("race")
		const maxRounds = 50
		for round := range maxRounds {
			winners := raceRound(t, coll, fmt.Sprintf("raw-%d", round), racers)
			if winners > 1 {
				t.Logf("round %d: %d winners of %d racers", round, winners, racers)
				return
			}
		}
		t.Fatalf("FerretDB gave at most one winner in each of %d rounds without the proxy: "+
			"if it makes single-document writes atomic now, the WireProxy may no longer be needed", maxRounds)
	})

	t.Run("Proxied", func(t *testing.T) {
		coll := connect(t, m.URI).Database(m.Database).Collection("race")
		const rounds = 50
		before := m.Proxy.Serialized()
		for round := range rounds {
			winners := raceRound(t, coll, fmt.Sprintf("proxied-%d", round), racers)
			require.Equal(t, 1, winners, "round %d: winners", round)
		}
		// One insert per round plus every racer's findAndModify.
		assert.GreaterOrEqual(t, m.Proxy.Serialized()-before, int64(rounds*(racers+1)))
	})
}

// raceRound inserts an expired lock document named name, lets racers take it over at once and
// returns how many succeeded.
func raceRound(t *testing.T, coll *mongo.Collection, name string, racers int) int {
	t.Helper()
	ctx := t.Context()
	now := time.Now()
	_, err := coll.InsertOne(ctx, bson.D{
		{Key: "_id", Value: name}, {Key: "owner", Value: "crashed"},
		{Key: "fence", Value: int64(1)}, {Key: "expires", Value: now.Add(-time.Second)},
	})
	require.NoError(t, err)

	filter := bson.D{{Key: "_id", Value: name}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "owner", Value: ""}},
		bson.D{{Key: "expires", Value: bson.D{{Key: "$lte", Value: now}}}},
	}}}
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)
	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		mu      sync.Mutex // protects winners and errs
		winners []string
		errs    []error
	)
	for i := range racers {
		owner := fmt.Sprintf("racer-%d", i)
		wg.Go(func() {
			<-start
			update := bson.D{
				{Key: "$set", Value: bson.D{{Key: "owner", Value: owner}, {Key: "expires", Value: now.Add(time.Minute)}}},
				{Key: "$inc", Value: bson.D{{Key: "fence", Value: int64(1)}}},
			}
			err := coll.FindOneAndUpdate(ctx, filter, update, opts).Err()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				winners = append(winners, owner)
			case !mongo.IsDuplicateKeyError(err):
				errs = append(errs, err)
			}
		})
	}
	close(start)
	wg.Wait()
	require.Empty(t, errs, "errors other than duplicate key")

	var doc struct {
		Owner string `bson:"owner"`
		Fence int64  `bson:"fence"`
	}
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Decode(&doc))
	if len(winners) == 1 {
		assert.Equal(t, winners[0], doc.Owner)
		assert.Equal(t, int64(2), doc.Fence)
	}
	return len(winners)
}

// TestWireProxyMoreToCome sends fire-and-forget (w:0) inserts, which go out as OP_MSG with
// moreToCome, over one connection through the proxy. FerretDB answers them anyway; the proxy
// must swallow those replies, or the next command on the connection would read a stray one.
func TestWireProxyMoreToCome(t *testing.T) {
	m := StartFerretDB(t)
	client := connect(t, m.URI, options.Client().SetMaxPoolSize(1))
	ctx := t.Context()
	unacked := client.Database(m.Database).Collection("w0",
		options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	before := m.Proxy.Serialized()
	for i := range 3 {
		_, err := unacked.InsertOne(ctx, bson.D{{Key: "_id", Value: i}})
		require.NoError(t, err)
	}
	n, err := client.Database(m.Database).Collection("w0").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
	assert.GreaterOrEqual(t, m.Proxy.Serialized()-before, int64(3))
}
