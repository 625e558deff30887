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
	"github.com/guardlock/guard/internal/display"
)

var (
	_ guard.Backend   = (*Store)(nil)
	_ guard.Inspector = (*Store)(nil)
	_ guard.Sharing   = (*Store)(nil)
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
	fieldValue    = "value"
	fieldRenewal  = "renewal"
	// Shared holds (see shared.go).
	fieldShared    = "shared" // the shared holders, by token key: a sharedEntry each
	fieldCount     = "n"      // how many entries shared has, live or not
	fieldSharedEnd = "se"     // the latest expiry any shared entry was given
	fieldNext      = "next"   // the waiting writer: {t: token, e: until when}
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
	coll   *mongo.Collection // with the store's write concern, primary reads, local read concern
	clock  clock
	epochs epochs // the epochs of names this Store granted shared holds of
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

// Acquire takes r.Name for r.Token when its document is free (no owner, and no shared holder)
// or its leases have run out by the server's clock — or r.Token holds it already (a retried
// request) — in one findAndModify: a conditional upsert that matches the document only when it
// may be taken, increments its fence and sets owner, expiry and holder metadata. When the name
// is held the upsert collides with the existing document (duplicate key), and Acquire returns
// a *guard.BusyError with Remaining 0: reading the holder's expiry would cost a second round
// trip. A writer that waits (r.Wait) spends it: it reads the document, takes out the entries
// of shared holders whose lease ran out, says how long the holders stay, and marks itself as
// the waiting writer, so that readers that come after it are refused.
//
// A shared request (r.Shared) is granted beside the other shared holders, up to r.Limit of
// them; see SharedLocks.
//
// The fence is the document's epoch plus its counter: the epoch is the server's time in
// microseconds when the document was created, so that a name whose document was deleted
// (Reclaim, or an operator) starts again above every fence it had.
//
// r.Instance, r.Label and r.Value are stored as text (NUL bytes and invalid UTF-8 replaced by U+FFFD):
// BSON strings are UTF-8, and servers differ in what they do with bytes that are not.
//
// Other errors are the driver's, including the context's.
func (s *Store) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	now, err := s.clock.now(ctx)
	if err != nil {
		return 0, err
	}
	if r.Shared {
		return s.acquireShared(ctx, r, now)
	}
	filter := bson.D{
		{Key: fieldID, Value: r.Name},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: fieldOwner, Value: r.Token}},
			bson.D{{Key: "$and", Value: bson.A{exclusiveFree(now), sharedFree(now)}}},
		}},
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: fieldOwner, Value: r.Token},
			{Key: fieldExpires, Value: expiry(now.latest(), r.TTL)},
			{Key: fieldAcquired, Value: now.t},
			{Key: fieldInstance, Value: display.Text(r.Instance)},
			{Key: fieldLabel, Value: display.Text(r.Label)},
			{Key: fieldValue, Value: display.Text(r.Value)},
			// Shared entries left can only be expired ones (sharedFree): they go.
			{Key: fieldShared, Value: bson.D{}},
			{Key: fieldCount, Value: int64(0)},
			// A writer's turn has come: the waiting writer's mark ends (it marks again if it
			// is not this one and still waits).
			{Key: fieldNext + ".e", Value: now.t},
		}},
		{Key: "$inc", Value: bson.D{{Key: fieldFence, Value: int64(1)}}},
		{Key: "$setOnInsert", Value: bson.D{{Key: fieldEpoch, Value: now.latest().UnixMicro()}}},
	}
	// No projection: FerretDB does not implement findAndModify's "fields", and the whole
	// document is small.
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)
	var doc struct {
		Fence int64 `bson:"fence"`
		Epoch int64 `bson:"epoch"`
	}
	for try := 0; ; try++ {
		err = s.coll.FindOneAndUpdate(ctx, filter, update, opts).Decode(&doc)
		switch {
		case err == nil:
			return uint64(doc.Epoch) + uint64(doc.Fence), nil
		case !mongo.IsDuplicateKeyError(err):
			return 0, err
		case !r.Wait || try > 0:
			return 0, &guard.BusyError{Name: r.Name}
		}
		// A writer that waits: see what keeps it out, and hold later readers back.
		again, err := s.busyWriter(ctx, r, now)
		if !again {
			return 0, err
		}
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
	// The last lease of a lock named twice stands (guard.Backend.Extend): each of them carries
	// its TTL, since the server runs an unordered batch's writes in any order.
	last := make(map[[2]string]time.Duration, len(leases))
	for _, l := range leases {
		last[[2]string{l.Name, l.Token}] = l.TTL
	}
	call := bson.NewObjectID().Hex()
	// Two updates per lease, of which one at most matches: the exclusive holder's, and the
	// shared entry's (a lease does not say which kind it is).
	models := make([]mongo.WriteModel, 0, 2*len(leases))
	expires := make([]time.Time, len(leases))
	for i, l := range leases {
		expires[i] = expiry(now.latest(), last[[2]string{l.Name, l.Token}])
		models = append(models, mongo.NewUpdateOneModel().
			SetFilter(bson.D{
				{Key: fieldID, Value: l.Name},
				{Key: fieldOwner, Value: l.Token},
				{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: now.earliest()}}},
			}).
			SetUpdate(bson.D{{Key: "$set", Value: bson.D{
				{Key: fieldExpires, Value: expires[i]},
				{Key: fieldRenewal, Value: call},
			}}}))
		k := entryPath(l.Token)
		models = append(models, mongo.NewUpdateOneModel().
			SetFilter(bson.D{
				{Key: fieldID, Value: l.Name},
				{Key: k + ".o", Value: l.Token},
				{Key: k + ".e", Value: bson.D{{Key: "$gt", Value: now.earliest()}}},
			}).
			SetUpdate(bson.D{
				{Key: "$set", Value: bson.D{{Key: k + ".e", Value: expires[i]}, {Key: k + ".r", Value: call}}},
				{Key: "$max", Value: bson.D{{Key: fieldSharedEnd, Value: expires[i]}}},
			}))
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
			if i := we.Index / 2; we.Index >= 0 && i < len(errs) && errs[i] == nil {
				errs[i] = we
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
			{Key: fieldShared, Value: 1},
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
		if !ok {
			errs[i] = guard.ErrNotHeld
			continue
		}
		owner, renewal, until := d.Owner, d.Renewal, d.Expires
		if e, ok := d.Shared[entryKey(l.Token)]; ok && d.Owner != l.Token {
			owner, renewal, until = e.Owner, e.Renewal, e.Expires
		}
		if owner != l.Token || (renewal != call && until.Before(expires[i])) {
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
		{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: now.earliest()}}},
	}
	set := bson.D{{Key: fieldOwner, Value: ""}, {Key: fieldExpires, Value: now.t}}
	if keep > 0 {
		set = bson.D{{Key: fieldOwner, Value: keptOwner}, {Key: fieldExpires, Value: expiry(now.latest(), keep)}}
	}
	// The same for a shared holder, in the same command: one of the two matches at most.
	k := entryPath(token)
	sharedFilter := bson.D{
		{Key: fieldID, Value: name},
		{Key: k + ".o", Value: token},
		{Key: k + ".e", Value: bson.D{{Key: "$gt", Value: now.earliest()}}},
	}
	sharedUpdate := bson.D{
		{Key: "$unset", Value: bson.D{{Key: k, Value: ""}}},
		{Key: "$inc", Value: bson.D{{Key: fieldCount, Value: int64(-1)}}},
	}
	if keep > 0 {
		until := expiry(now.latest(), keep)
		sharedUpdate = bson.D{
			{Key: "$set", Value: bson.D{{Key: k + ".o", Value: keptOwner}, {Key: k + ".e", Value: until}}},
			{Key: "$max", Value: bson.D{{Key: fieldSharedEnd, Value: until}}},
		}
	}
	res, err := s.coll.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewUpdateOneModel().SetFilter(filter).SetUpdate(bson.D{{Key: "$set", Value: set}}),
		mongo.NewUpdateOneModel().SetFilter(sharedFilter).SetUpdate(sharedUpdate),
	}, options.BulkWrite().SetOrdered(false))
	if err != nil {
		return err
	}
	if res.MatchedCount == 0 {
		// Not a holder: a writer that gave up waiting takes its mark back.
		if _, err := s.coll.UpdateOne(ctx, bson.D{{Key: fieldID, Value: name}, {Key: fieldNext + ".t", Value: token}},
			bson.D{{Key: "$unset", Value: bson.D{{Key: fieldNext, Value: ""}}}}); err != nil {
			return err
		}
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
	since := now.earliest().Add(-idle)
	res, err := s.coll.DeleteMany(ctx, bson.D{
		{Key: fieldExpires, Value: bson.D{{Key: "$lt", Value: since}}},
		{Key: "$or", Value: bson.A{ // and no shared holder since
			bson.D{{Key: fieldCount, Value: bson.D{{Key: "$lte", Value: 0}}}},
			bson.D{{Key: fieldCount, Value: bson.D{{Key: "$exists", Value: false}}}},
			bson.D{{Key: fieldSharedEnd, Value: bson.D{{Key: "$lt", Value: since}}}},
		}},
	})
	if err != nil {
		return 0, err
	}
	return res.DeletedCount, nil
}

// SyncClock measures the offset of the server's clock now, with a hello command, instead of
// waiting for the next operation to find the measurement stale. Every expiry a Store writes
// or compares is in the server's time, estimated as the local monotonic clock plus this
// offset, and allows for the estimate's uncertainty (ClockOffset) on both sides: a lease is
// written to end its TTL after the latest the server's time may be, and is over only once it
// ended before the earliest. Calling it once at startup keeps the first lock operation to one
// round trip.
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
	ID      string                 `bson:"_id"`
	Owner   string                 `bson:"owner"`
	Expires time.Time              `bson:"expires"`
	Renewal string                 `bson:"renewal"`
	Shared  map[string]sharedEntry `bson:"shared"`
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

// instant is an estimate of the server's time: the server's clock reads within t ± unc.
//
// Every expiry decision allows for unc on both sides, so that stores whose estimates err in
// opposite directions still agree: a lease of d is written to end d after the latest the
// server's time may be, and a lease counts as over only once it ended before the earliest.
type instant struct {
	t   time.Time
	unc time.Duration
}

// earliest returns the soonest the server's time may be: a lease is over, for the store, when
// it ended at or before it.
func (i instant) earliest() time.Time { return i.t.Add(-i.unc) }

// latest returns the latest the server's time may be: a lease of d ends d after it.
func (i instant) latest() time.Time { return i.t.Add(i.unc) }

// now returns the estimated current time of the server and its uncertainty, measuring it
// first when there is no estimate yet or the last one is older than refresh. A failed
// refresh keeps the old estimate.
//
// The estimate runs on the local monotonic clock, which stops while the host is suspended: a
// host that was away (its wall clock ran ahead of the monotonic one) measures again before it
// trusts the estimate.
func (c *clock) now(ctx context.Context) (instant, error) {
	c.mu.Lock()
	if !c.at.IsZero() && c.suspended() {
		c.at = time.Time{} // measure again, everyone waiting for it
	}
	have := !c.at.IsZero()
	if have && (c.syncing || time.Since(c.checked) < c.refresh) {
		now := c.instant()
		c.mu.Unlock()
		return now, nil
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
		return instant{}, fmt.Errorf("measuring the server's clock: %w", err)
	}
	return c.instant(), nil
}

// instant returns the estimate for now. c.mu must be held, and c.at set.
func (c *clock) instant() instant {
	local := time.Now()
	return instant{t: c.base.Add(local.Sub(c.at)), unc: c.uncertaintyAt(local)}
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
