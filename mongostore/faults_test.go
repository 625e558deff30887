package mongostore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/mongostore"
)

// TestLostAcquireReply (issue 8, defect 1): the server runs an acquire and its reply is lost.
// The Guard must not strand the lock for the whole lease: it releases its token. (The driver
// does not retry: FerretDB is no replica set, so writes are not retryable.)
func TestLostAcquireReply(t *testing.T) {
	srv := testserver.StartFerretDB(t)
	p := testserver.StartFaultProxy(t, srv.Proxy.Addr)
	via := &testserver.Mongo{URI: "mongodb://" + p.Addr + "/?directConnection=true", Database: srv.Database}
	g := guard.New(newClient(t, via).store)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	other := guard.New(newClient(t, srv).store)
	t.Cleanup(func() { _ = other.Close(context.Background()) })

	f := p.DropReply(testserver.MatchMongoCommand("findAndModify"))
	_, err := g.TryAcquire(t.Context(), "lost-reply")
	require.Error(t, err)
	require.NotErrorIs(t, err, guard.ErrNotAcquired, "a lost reply is a backend failure, not busy")
	<-f.Done()
	l, err := other.Acquire(t.Context(), "lost-reply", guard.WaitTime(5*time.Second))
	require.NoError(t, err, "the lock whose reply was lost stayed taken for its 30 s lease")
	require.NoError(t, l.Release(t.Context()))
}

// TestSuspendedHostMeasuresAgain (issue 8): the estimate of the server's clock runs on the
// local monotonic clock, which stops while the host is suspended. After a suspension (faked:
// the wall clock jumps ahead, the monotonic one does not) the store must measure the server's
// clock again before it judges an expiry.
func TestSuspendedHostMeasuresAgain(t *testing.T) {
	srv := testserver.StartMongo(t)
	c := newClient(t, srv, mongostore.WithClockRefresh(time.Hour))
	hello := func(cmds []string) int {
		n := 0
		for _, name := range cmds {
			if strings.EqualFold(name, "hello") {
				n++
			}
		}
		return n
	}
	cmds := c.count(func() {
		_, err := c.store.Acquire(t.Context(), guard.Request{Name: "suspend", Token: "a", TTL: time.Minute})
		require.NoError(t, err)
	})
	assert.Zero(t, hello(cmds), "the fresh estimate was measured again: %v", cmds)

	mongostore.SetWallOffset(c.store, time.Hour) // the host was away for an hour
	cmds = c.count(func() {
		require.NoError(t, c.store.Release(t.Context(), "suspend", "a", 0))
	})
	assert.NotZero(t, hello(cmds), "the estimate was trusted after a suspension: %v", cmds)
	off, _ := c.store.ClockOffset()
	assert.Less(t, off.Abs(), time.Minute, "the new estimate is the server's clock, not the stale one")
}

// TestReclaim (issue 8): documents of names idle for longer than the idle time go; fences of
// a reclaimed name keep increasing when it is taken again.
func TestReclaim(t *testing.T) {
	srv := testserver.StartMongo(t)
	c := newClient(t, srv)
	ctx := t.Context()
	_, err := c.store.Reclaim(ctx, time.Second)
	require.ErrorIs(t, err, mongostore.ErrIdleTooShort)

	var fences []uint64
	for _, name := range []string{"idle", "held", "recent"} {
		f, err := c.store.Acquire(ctx, guard.Request{Name: name, Token: "t-" + name, TTL: time.Hour})
		require.NoError(t, err)
		fences = append(fences, f)
	}
	require.NoError(t, c.store.Release(ctx, "idle", "t-idle", 0))
	require.NoError(t, c.store.Release(ctx, "recent", "t-recent", 0))
	// "idle" became free two hours ago.
	_, err = c.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "idle"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires", Value: time.Now().Add(-2 * time.Hour)}}}})
	require.NoError(t, err)

	n, err := c.store.Reclaim(ctx, time.Hour)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	err = c.coll.FindOne(ctx, bson.D{{Key: "_id", Value: "idle"}}).Err()
	assert.ErrorIs(t, err, mongo.ErrNoDocuments, "the idle document was kept")
	for _, name := range []string{"held", "recent"} {
		require.NoError(t, c.coll.FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Err(), "%s was reclaimed", name)
	}

	f, err := c.store.Acquire(ctx, guard.Request{Name: "idle", Token: "again", TTL: time.Minute})
	require.NoError(t, err)
	assert.Greater(t, f, fences[0], "a reclaimed name's fence went backwards")
	count, err := c.coll.CountDocuments(ctx, bson.D{}, options.Count())
	require.NoError(t, err)
	assert.EqualValues(t, 3, count)
}
