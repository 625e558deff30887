package mongostore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
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

var _ guard.Backend = (*Store)(nil)

// Field names of a lock document; see the package documentation for the schema.
const (
	fieldID       = "_id"
	fieldOwner    = "owner"
	fieldFence    = "fence"
	fieldExpires  = "expires"
	fieldAcquired = "acquired"
	fieldHost     = "host"
	fieldPID      = "pid"
	fieldInstance = "instance"
	fieldRenewal  = "renewal"
)

// DefaultClockRefresh is how often a Store measures the server's clock again by default.
const DefaultClockRefresh = time.Minute

// Store keeps locks in a MongoDB collection, one document per lock name. It is safe for
// concurrent use. Create it with New.
type Store struct {
	coll     *mongo.Collection // with the store's write concern, primary reads, local read concern
	host     string
	pid      int
	instance string
	clock    clock
}

// Option configures a Store. Pass options to New.
type Option func(*settings)

type settings struct {
	wc       *writeconcern.WriteConcern
	instance string
	refresh  time.Duration
}

// WithWriteConcern sets the write concern of every lock write. Default: majority, so that a
// lock survives the failover of a replica set's primary. A weaker concern (w:1) is faster
// but a primary that fails before replicating an acquisition can come back without it, and
// a second owner can then take the same name with the same fence. An unacknowledged concern
// (w:0) cannot tell a lock taken from a busy one, so New rejects it.
func WithWriteConcern(wc *writeconcern.WriteConcern) Option {
	return func(s *settings) {
		if wc == nil || !wc.Acknowledged() {
			panic("guard/mongostore: WithWriteConcern needs an acknowledged write concern")
		}
		s.wc = wc
	}
}

// WithInstance sets the instance recorded in the documents of the locks this Store takes,
// beside the host name and process id, for people who look at the collection (a pod name, a
// service instance id). Default: a random id per Store.
func WithInstance(id string) Option {
	return func(s *settings) { s.instance = id }
}

// WithClockRefresh sets how often the Store measures the server's clock again (see
// Store.SyncClock); the operation that finds the measurement older than d runs it first, one
// extra round trip. Default: DefaultClockRefresh (1 min). d must be positive.
func WithClockRefresh(d time.Duration) Option {
	return func(s *settings) {
		if d <= 0 {
			panic(fmt.Sprintf("guard/mongostore: WithClockRefresh(%v): must be positive", d))
		}
		s.refresh = d
	}
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
	if s.instance == "" {
		s.instance = rand.Text()[:16]
	}
	host, _ := os.Hostname()
	st := &Store{
		coll: coll.Clone(options.Collection().
			SetWriteConcern(s.wc).
			// Our own reads (Extend's fallback) must see our own writes.
			SetReadPreference(readpref.Primary()).
			SetReadConcern(readconcern.Local())),
		host:     host,
		pid:      os.Getpid(),
		instance: s.instance,
	}
	st.clock.db = coll.Database()
	st.clock.refresh = s.refresh
	return st
}

// Acquire takes name for token when its document is free (no owner) or its lease has run out
// by the server's clock, in one findAndModify: a conditional upsert that matches the document
// only when it may be taken, increments its fence and sets owner, expiry and holder metadata.
// When the name is held the upsert collides with the existing document (duplicate key), and
// Acquire returns a *guard.BusyError with Remaining 0: reading the holder's expiry would cost a
// second round trip.
//
// Other errors are wrapped driver errors, including the context's.
func (s *Store) Acquire(ctx context.Context, name, token string, ttl time.Duration) (uint64, error) {
	now, err := s.clock.now(ctx)
	if err != nil {
		return 0, fmt.Errorf("guard/mongostore: acquire %q: %w", name, err)
	}
	filter := bson.D{
		{Key: fieldID, Value: name},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: fieldOwner, Value: ""}},
			bson.D{{Key: fieldExpires, Value: bson.D{{Key: "$lte", Value: now}}}},
		}},
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: fieldOwner, Value: token},
			{Key: fieldExpires, Value: expiry(now, ttl)},
			{Key: fieldAcquired, Value: now},
			{Key: fieldHost, Value: s.host},
			{Key: fieldPID, Value: s.pid},
			{Key: fieldInstance, Value: s.instance},
		}},
		{Key: "$inc", Value: bson.D{{Key: fieldFence, Value: int64(1)}}},
	}
	// No projection: FerretDB does not implement findAndModify's "fields", and the whole
	// document is small.
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)
	var doc struct {
		Fence int64 `bson:"fence"`
	}
	err = s.coll.FindOneAndUpdate(ctx, filter, update, opts).Decode(&doc)
	switch {
	case err == nil:
		return uint64(doc.Fence), nil
	case mongo.IsDuplicateKeyError(err):
		return 0, &guard.BusyError{Name: name}
	default:
		return 0, fmt.Errorf("guard/mongostore: acquire %q: %w", name, err)
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
		for i, l := range leases {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("guard/mongostore: extend %q: %w", l.Name, err)
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
				errs[we.Index] = fmt.Errorf("guard/mongostore: extend %q: %w", leases[we.Index].Name, we)
				failed++
			}
		}
	}
	switch int(res.MatchedCount) {
	case len(leases) - failed:
		return errs // every lease without a write error was extended
	case 0:
		for i, l := range leases {
			if errs[i] == nil {
				errs[i] = notHeld(l.Name)
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
		for i, l := range leases {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("guard/mongostore: extend %q: reading the outcome: %w", l.Name, err)
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
			errs[i] = notHeld(l.Name)
		}
	}
	return errs
}

// Release frees name if token holds it and its lease has not run out, in one update that
// keeps the document (and so its fence) and clears its owner. With keep > 0 it instead sets
// the lease to end keep from now, under the same owner, so that nobody takes the name before
// then.
//
// It returns an error matching guard.ErrNotHeld when token does not hold name, or a wrapped
// driver error.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	now, err := s.clock.now(ctx)
	if err != nil {
		return fmt.Errorf("guard/mongostore: release %q: %w", name, err)
	}
	filter := bson.D{
		{Key: fieldID, Value: name},
		{Key: fieldOwner, Value: token},
		{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: now}}},
	}
	set := bson.D{{Key: fieldOwner, Value: ""}, {Key: fieldExpires, Value: now}}
	if keep > 0 {
		set = bson.D{{Key: fieldExpires, Value: expiry(now, keep)}}
	}
	res, err := s.coll.UpdateOne(ctx, filter, bson.D{{Key: "$set", Value: set}})
	if err != nil {
		return fmt.Errorf("guard/mongostore: release %q: %w", name, err)
	}
	if res.MatchedCount == 0 {
		return notHeld(name)
	}
	return nil
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

func notHeld(name string) error {
	return fmt.Errorf("guard/mongostore: %q: %w", name, guard.ErrNotHeld)
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

	mu      sync.Mutex // protects the fields below
	base    time.Time  // the server's time at local instant at
	at      time.Time  // local time, with its monotonic reading, when the server's time was base
	unc     time.Duration
	checked time.Time // last sync attempt that got an answer
	syncing bool      // a refresh is running; others use the current estimate meanwhile
}

// now returns the estimated current time of the server, measuring it first when there is no
// estimate yet or the last one is older than refresh. A failed refresh keeps the old estimate.
func (c *clock) now(ctx context.Context) (time.Time, error) {
	c.mu.Lock()
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
	}
	return nil
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
