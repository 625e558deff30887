package mongostore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/guardlock/guard"
)

var (
	_ guard.Backend   = (*Store)(nil)
	_ guard.Inspector = (*Store)(nil)
)

// Field names of a lock document; see the package documentation for the schema.
const (
	fieldID       = "_id"
	fieldOwner    = "owner"
	fieldFence    = "fence"
	fieldEpoch    = "epoch"
	fieldExpires  = "expires"
	fieldAcquired = "acquired"
	fieldInstance = "instance"
	fieldLabel    = "label"
	fieldRenewal  = "renewal"
)

// keptOwner is the owner of a lock kept for the rest of a MinHold window: no token is equal to
// it (tokens are base32), so no renewal of the old owner can match it.
const keptOwner = "(kept)"

// DefaultClockRefresh is how often a Store measures the server's clock again by default.
const DefaultClockRefresh = time.Minute

// MinReclaimIdle is the shortest idle time Reclaim accepts: a fence restarted from the clock
// must lie above the reclaimed one even if two stores' estimates of the server's clock
// disagree.
const MinReclaimIdle = time.Minute

// ErrIdleTooShort reports a Reclaim with an idle time under MinReclaimIdle.
var ErrIdleTooShort = errors.New("mongostore: reclaim idle time too short")

// Store keeps locks in a MongoDB collection, one document per lock name. It is safe for
// concurrent use. Create it with New.
type Store struct {
	coll  *mongo.Collection // with the store's write concern, primary reads, local read concern
	clock clock
}

// Option configures a Store. Pass options to New, which validates them.
type Option func(*settings)

type settings struct {
	wc      *writeconcern.WriteConcern
	refresh time.Duration
}

// WithWriteConcern sets the write concern of every lock write. Default: majority, so that a
// lock survives the failover of a replica set's primary. A weaker concern (w:1) is faster
// but a primary that fails before replicating an acquisition can come back without it, and
// a second owner can then take the same name. An unacknowledged concern (w:0) cannot tell a
// lock taken from a busy one, so New rejects it.
func WithWriteConcern(wc *writeconcern.WriteConcern) Option {
	return func(s *settings) { s.wc = wc }
}

// WithClockRefresh sets how often the Store measures the server's clock again (see
// Store.SyncClock); the operation that finds the measurement older than d runs it first, one
// extra round trip. Default: DefaultClockRefresh (1 min). d must be positive.
func WithClockRefresh(d time.Duration) Option {
	return func(s *settings) { s.refresh = d }
}

// New returns a Store that keeps its locks in coll. It does no I/O: the first operation
// measures the server's clock (or call SyncClock first). New panics on a nil collection or
// an invalid option.
func New(coll *mongo.Collection, opts ...Option) *Store {
	if coll == nil {
		panic("guard/mongostore: New with a nil collection")
	}
	s := settings{wc: writeconcern.Majority(), refresh: DefaultClockRefresh}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if s.wc == nil || !s.wc.Acknowledged() {
		panic("guard/mongostore: WithWriteConcern needs an acknowledged write concern")
	}
	if s.refresh <= 0 {
		panic(fmt.Sprintf("guard/mongostore: WithClockRefresh(%v): must be positive", s.refresh))
	}
	st := &Store{
		coll: coll.Clone(options.Collection().
			SetWriteConcern(s.wc).
			// Our own reads (Extend's fallback) must see our own writes.
			SetReadPreference(readpref.Primary()).
			SetReadConcern(readconcern.Local())),
	}
	st.clock.db = coll.Database()
	st.clock.refresh = s.refresh
	st.clock.wallOffset = func() time.Duration { return 0 }
	return st
}

// Acquire takes r.Name for r.Token when its document is free (no owner) or its lease has run
// out by the server's clock — or r.Token holds it already (a retried request) — in one
// findAndModify: a conditional upsert that matches the document only when it may be taken,
// increments its fence and sets owner, expiry and holder metadata. When the name is held the
// upsert collides with the existing document (duplicate key), and Acquire returns a
// *guard.BusyError with Remaining 0: reading the holder's expiry would cost a second round trip.
//
// The fence is the document's epoch plus its counter: the epoch is the server's time in
// microseconds when the document was created, so that a name whose document was deleted
// (Reclaim, or an operator) starts again above every fence it had.
//
// Other errors are the driver's, including the context's.
func (s *Store) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	now, err := s.clock.now(ctx)
	if err != nil {
		return 0, err
	}
	filter := bson.D{
		{Key: fieldID, Value: r.Name},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: fieldOwner, Value: ""}},
			bson.D{{Key: fieldExpires, Value: bson.D{{Key: "$lte", Value: now}}}},
			bson.D{{Key: fieldOwner, Value: r.Token}},
		}},
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: fieldOwner, Value: r.Token},
			{Key: fieldExpires, Value: expiry(now, r.TTL)},
			{Key: fieldAcquired, Value: now},
			{Key: fieldInstance, Value: r.Instance},
			{Key: fieldLabel, Value: r.Label},
		}},
		{Key: "$inc", Value: bson.D{{Key: fieldFence, Value: int64(1)}}},
		{Key: "$setOnInsert", Value: bson.D{{Key: fieldEpoch, Value: now.UnixMicro()}}},
	}
	// No projection: FerretDB does not implement findAndModify's "fields", and the whole
	// document is small.
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)
	var doc struct {
		Fence int64 `bson:"fence"`
		Epoch int64 `bson:"epoch"`
	}
	err = s.coll.FindOneAndUpdate(ctx, filter, update, opts).Decode(&doc)
	switch {
	case err == nil:
		return uint64(doc.Epoch) + uint64(doc.Fence), nil
	case mongo.IsDuplicateKeyError(err):
		return 0, &guard.BusyError{Name: r.Name}
	default:
		return 0, err
	}
}

// Extend sets the lease of each lock in leases that its token still holds, unexpired, to its
// TTL from now. It sends all of them in one unordered bulk write (one update command). When
// the server reports fewer matches than leases, Extend reads the documents of the batch once
// more to tell which ones it extended: each update also stamps the document with an id of this
// call, so a lease counts as extended when its document still has its token and either that
// stamp or an expiry at least as late as the one asked for.
//
// Each error is nil, an error matching guard.ErrNotHeld, or a wrapped driver error.
func (s *Store) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := make([]error, len(leases))
	if len(leases) == 0 {
		return errs
	}
	fail := func(err error) []error {
		for i := range leases {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	now, err := s.clock.now(ctx)
	if err != nil {
		return fail(err)
	}
	call := bson.NewObjectID().Hex()
	models := make([]mongo.WriteModel, len(leases))
	expires := make([]time.Time, len(leases))
	for i, l := range leases {
		expires[i] = expiry(now, l.TTL)
		models[i] = mongo.NewUpdateOneModel().
			SetFilter(bson.D{
				{Key: fieldID, Value: l.Name},
				{Key: fieldOwner, Value: l.Token},
				{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: now}}},
			}).
			SetUpdate(bson.D{{Key: "$set", Value: bson.D{
				{Key: fieldExpires, Value: expires[i]},
				{Key: fieldRenewal, Value: call},
			}}})
	}
	res, err := s.coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	failed := 0
	if err != nil {
		var bwe mongo.BulkWriteException
		if !errors.As(err, &bwe) || bwe.WriteConcernError != nil || len(bwe.WriteErrors) == 0 {
			// The whole batch failed, or its writes are not known to be durable.
			return fail(err)
		}
		for _, we := range bwe.WriteErrors {
			if we.Index >= 0 && we.Index < len(errs) && errs[we.Index] == nil {
				errs[we.Index] = we
				failed++
			}
		}
	}
	switch int(res.MatchedCount) {
	case len(leases) - failed:
		return errs // every lease without a write error was extended
	case 0:
		for i := range leases {
			if errs[i] == nil {
				errs[i] = guard.ErrNotHeld
			}
		}
		return errs
	}
	return s.resolveExtend(ctx, leases, expires, call, errs)
}

// resolveExtend reads the documents of a partly applied Extend batch and sets errs[i] for
// each lease, without a write error already, that the batch did not extend.
func (s *Store) resolveExtend(ctx context.Context, leases []guard.Lease, expires []time.Time,
	call string, errs []error,
) []error {
	names := make(bson.A, 0, len(leases))
	for i, l := range leases {
		if errs[i] == nil {
			names = append(names, l.Name)
		}
	}
	cur, err := s.coll.Find(ctx,
		bson.D{{Key: fieldID, Value: bson.D{{Key: "$in", Value: names}}}},
		options.Find().SetProjection(bson.D{
			{Key: fieldOwner, Value: 1}, {Key: fieldExpires, Value: 1}, {Key: fieldRenewal, Value: 1},
		}))
	var docs []lockDoc
	if err == nil {
		err = cur.All(ctx, &docs)
	}
	if err != nil {
		for i := range leases {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("reading the outcome of a renewal: %w", err)
			}
		}
		return errs
	}
	byName := make(map[string]lockDoc, len(docs))
	for _, d := range docs {
		byName[d.ID] = d
	}
	for i, l := range leases {
		if errs[i] != nil {
			continue
		}
		d, ok := byName[l.Name]
		if !ok || d.Owner != l.Token || (d.Renewal != call && d.Expires.Before(expires[i])) {
			errs[i] = guard.ErrNotHeld
		}
	}
	return errs
}

// Release frees name if token holds it and its lease has not run out, in one update that
// keeps the document (and so its fence) and clears its owner. With keep > 0 it instead hands
// the document to an owner no token matches, with a lease that ends keep from now, so that
// nobody takes the name before then and no renewal of token still on the wire can shorten it.
//
// It returns guard.ErrNotHeld when token does not hold name, or the driver's error.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	now, err := s.clock.now(ctx)
	if err != nil {
		return err
	}
	filter := bson.D{
		{Key: fieldID, Value: name},
		{Key: fieldOwner, Value: token},
		{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: now}}},
	}
	set := bson.D{{Key: fieldOwner, Value: ""}, {Key: fieldExpires, Value: now}}
	if keep > 0 {
		set = bson.D{{Key: fieldOwner, Value: keptOwner}, {Key: fieldExpires, Value: expiry(now, keep)}}
	}
	res, err := s.coll.UpdateOne(ctx, filter, bson.D{{Key: "$set", Value: set}})
	if err != nil {
		return err
	}
	if res.MatchedCount == 0 {
		return guard.ErrNotHeld
	}
	return nil
}

// Reclaim deletes the documents of names that have been free for longer than idle, so that a
// service that locks one name per request does not grow the collection forever. Fences stay in
// order: a name taken again gets a new document whose epoch, the server's time, lies above
// every fence the old one gave (see Acquire). idle must be at least MinReclaimIdle, which
// covers the uncertainty of two stores' estimates of the server's clock; otherwise Reclaim
// returns ErrIdleTooShort. It returns how many documents it deleted.
func (s *Store) Reclaim(ctx context.Context, idle time.Duration) (int64, error) {
	if idle < MinReclaimIdle {
		return 0, fmt.Errorf("%w: %v, less than %v", ErrIdleTooShort, idle, MinReclaimIdle)
	}
	now, err := s.clock.now(ctx)
	if err != nil {
		return 0, err
	}
	// A lock that ended on its own (or a kept one whose window closed) is as free as a
	// released one: its expiry is when it became free.
	res, err := s.coll.DeleteMany(ctx, bson.D{{Key: fieldExpires, Value: bson.D{{Key: "$lt", Value: now.Add(-idle)}}}})
	if err != nil {
		return 0, err
	}
	return res.DeletedCount, nil
}

// SyncClock measures the offset of the server's clock now, with a hello command, instead of
// waiting for the next operation to find the measurement stale. Every expiry a Store writes
// or compares is in the server's time, estimated as the local monotonic clock plus this
// offset. Calling it once at startup keeps the first lock operation to one round trip.
func (s *Store) SyncClock(ctx context.Context) error {
	return s.clock.sync(ctx)
}

// ClockOffset returns the estimated offset of the server's clock from the local one (server
// minus local) and the uncertainty of that estimate: half the round trip of the measurement,
// the server's millisecond resolution, and a drift allowance that grows with its age. Both are
// 0 before the first measurement.
func (s *Store) ClockOffset() (offset, uncertainty time.Duration) {
	return s.clock.offset()
}

// lockDoc is the part of a lock document that Extend reads back.
type lockDoc struct {
	ID      string    `bson:"_id"`
	Owner   string    `bson:"owner"`
	Expires time.Time `bson:"expires"`
	Renewal string    `bson:"renewal"`
}

// expiry returns now+d rounded up to the millisecond, the resolution of a BSON date: a lease
// is stored at least as long as it was asked for, never a fraction of a millisecond shorter.
func expiry(now time.Time, d time.Duration) time.Time {
	t := now.Add(d)
	if r := t.Truncate(time.Millisecond); !r.Equal(t) {
		return r.Add(time.Millisecond)
	}
	return t
}

// driftRate bounds how fast the local monotonic clock and the server's clock may drift apart
// (100 ppm, ten times a typical crystal's error).
const driftRate = 1e-4

// clock estimates the server's time from samples of hello's localTime.
type clock struct {
	db      *mongo.Database
	refresh time.Duration

	mu sync.Mutex // protects the fields below
	// wallOffset is added to the local wall clock; tests move it to fake a suspended host.
	wallOffset func() time.Duration
	base       time.Time // the server's time at local instant at
	at         time.Time // local time, with its monotonic reading, when the server's time was base
	atWall     time.Time // the wall clock at that instant, to notice a suspended host
	unc        time.Duration
	checked    time.Time // last sync attempt that got an answer
	syncing    bool      // a refresh is running; others use the current estimate meanwhile
}

// now returns the estimated current time of the server, measuring it first when there is no
// estimate yet or the last one is older than refresh. A failed refresh keeps the old estimate.
//
// The estimate runs on the local monotonic clock, which stops while the host is suspended: a
// host that was away (its wall clock ran ahead of the monotonic one) measures again before it
// trusts the estimate.
func (c *clock) now(ctx context.Context) (time.Time, error) {
	c.mu.Lock()
	if !c.at.IsZero() && c.suspended() {
		c.at = time.Time{} // measure again, everyone waiting for it
	}
	have := !c.at.IsZero()
	if have && (c.syncing || time.Since(c.checked) < c.refresh) {
		t := c.base.Add(time.Since(c.at))
		c.mu.Unlock()
		return t, nil
	}
	c.syncing = have // a first measurement is not shared: everyone waits for one
	c.mu.Unlock()

	err := c.sync(ctx)

	c.mu.Lock()
	defer c.mu.Unlock()
	if have {
		c.syncing = false
	}
	if c.at.IsZero() {
		return time.Time{}, fmt.Errorf("measuring the server's clock: %w", err)
	}
	return c.base.Add(time.Since(c.at)), nil
}

// sync samples the server's clock (twice for the first measurement, whose first round trip
// may include opening a connection) and keeps the estimate with the smaller uncertainty.
func (c *clock) sync(ctx context.Context) error {
	c.mu.Lock()
	samples := 1
	if c.at.IsZero() {
		samples = 2
	}
	c.mu.Unlock()
	for range samples {
		if err := c.sample(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (c *clock) sample(ctx context.Context) error {
	var reply struct {
		LocalTime time.Time `bson:"localTime"`
	}
	t0 := time.Now()
	// The primary's clock: every store must measure the same one.
	err := c.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}},
		options.RunCmd().SetReadPreference(readpref.Primary())).Decode(&reply)
	t1 := time.Now()
	if err != nil {
		return err
	}
	if reply.LocalTime.IsZero() {
		return errors.New("hello reply has no localTime")
	}
	rtt := t1.Sub(t0)
	mid := t0.Add(rtt / 2)
	// localTime is truncated to the millisecond: the server's time was within the next one.
	base := reply.LocalTime.Add(time.Millisecond / 2)
	unc := rtt/2 + time.Millisecond/2

	c.mu.Lock()
	defer c.mu.Unlock()
	c.checked = t1
	if c.at.IsZero() || unc <= c.uncertaintyAt(t1) {
		c.base, c.at, c.unc = base, mid, unc
		c.atWall = mid.Round(0).Add(c.wallOffset())
	}
	return nil
}

// suspendSlack is how far the wall clock may run ahead of the monotonic one, beyond 1% of the
// time elapsed, before the host counts as having been suspended.
const suspendSlack = 50 * time.Millisecond

// suspended reports whether the host was suspended since the estimate was made. c.mu must be
// held.
func (c *clock) suspended() bool {
	mono := time.Since(c.at)
	wall := time.Now().Round(0).Add(c.wallOffset()).Sub(c.atWall)
	return wall-mono > suspendSlack+mono/100
}

// uncertaintyAt returns the uncertainty of the current estimate at local time t. c.mu must be
// held.
func (c *clock) uncertaintyAt(t time.Time) time.Duration {
	return c.unc + time.Duration(float64(t.Sub(c.at))*driftRate)
}

func (c *clock) offset() (offset, uncertainty time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return 0, 0
	}
	return c.base.Sub(c.at.Round(0)), c.uncertaintyAt(time.Now())
}
