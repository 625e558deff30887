package mongostore

import (
	"context"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/display"
	"github.com/guardlock/guard/watchdog"
)

// Shared holds live in the name's document beside the exclusive holder's fields: an embedded
// document "shared" with one entry per holder, under a key made from its token (entryKey), so
// that an update can reach one holder by its path; "n" counts the entries and "se" is the
// latest expiry any of them was given. Query operators cannot count the live entries of an
// embedded document (FerretDB has neither $expr nor pipeline updates), so:
//
//   - a shared grant with a limit asks for n < Limit, counting entries whose lease ran out
//     (a crashed holder's) until a busy answer's read finds them and takes them out;
//   - an exclusive grant asks for n = 0, or for se in the past: every entry has ended then,
//     and the grant empties shared;
//   - a grant of either kind that takes a shared entry's fence cannot copy the document's
//     counter into the entry in the same update, so a shared grant sets the counter to a
//     value it chooses, above the current one (the filter checks that): the microseconds
//     since the document's epoch, by the server's clock, which no run of grants can overtake.
//
// A writer that waits marks itself in "next" ({t: token, e: until}); shared grants are refused
// while the mark lasts, so that readers that come later do not pass it. Any exclusive grant
// ends the mark — a writer that is not yet served marks again at its next attempt.

// SharedLocks tells that a Store grants shared holds (guard.Sharing): the permits of a
// Semaphore and the readers of an RWMutex. A shared grant is one findAndModify when the Store
// knows the name's epoch — it granted or saw a shared hold of the name before — or the name has
// no document yet, else three (a look, and the grant again). Its renewal and its release are
// one command each, as an exclusive lock's: Extend and Release send the update for an
// exclusive holder and the one for a shared holder in the same command, and one matches. A
// busy shared request reads the document once more, to take out entries whose lease ran out
// (a dead holder's permit comes back then) and to say how long the name stays busy.
func (*Store) SharedLocks() {}

// QueueTimeout bounds how long a waiting writer's mark holds later readers back after the
// writer's last attempt: never longer than the lease it asked for (watchdog.Place), and never
// shorter than minMark.
const QueueTimeout = 5 * time.Second

// minMark is the shortest a writer's mark lasts: longer than a waiter's longest backoff
// between attempts (a second), so that a live writer renews its mark before it lapses.
const minMark = 2 * time.Second

// sharedEntry is one shared holder.
type sharedEntry struct {
	Owner    string    `bson:"o"` // the holder's token, or keptOwner for a MinHold window
	Fence    int64     `bson:"f"` // the document's counter that the grant set
	Expires  time.Time `bson:"e"`
	Acquired time.Time `bson:"a"`
	Instance string    `bson:"i"`
	Label    string    `bson:"l"`
	Value    string    `bson:"v"`
	Renewal  string    `bson:"r"`
}

// entryKey returns the key of token's entry in shared: the token itself when it is made of
// letters, digits, '-' and '_' (a Guard's tokens are), otherwise '~' and its hex, so that no
// token makes a path with a dot or a '$' in it, and no two tokens share a key.
func entryKey(token string) string {
	for i := 0; i < len(token); i++ {
		c := token[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "~" + hex.EncodeToString([]byte(token))
		}
	}
	if token == "" {
		return "~"
	}
	return token
}

// entryPath returns the path of token's entry.
func entryPath(token string) string { return fieldShared + "." + entryKey(token) }

// exclusiveFree matches a document that no exclusive holder holds (or keeps) at now.
func exclusiveFree(now instant) bson.D {
	return bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: fieldOwner, Value: ""}},
		bson.D{{Key: fieldOwner, Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: fieldExpires, Value: bson.D{{Key: "$lte", Value: now.earliest()}}}},
	}}}
}

// sharedFree matches a document that no shared holder holds (or keeps) at now.
func sharedFree(now instant) bson.D {
	return bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: fieldCount, Value: bson.D{{Key: "$lte", Value: 0}}}},
		bson.D{{Key: fieldCount, Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: fieldSharedEnd, Value: bson.D{{Key: "$lte", Value: now.earliest()}}}},
	}}}
}

// noWriterWaits matches a document without a live mark of a waiting writer.
func noWriterWaits(now instant) bson.D {
	return bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: fieldNext + ".t", Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: fieldNext + ".e", Value: bson.D{{Key: "$lte", Value: now.earliest()}}}},
	}}}
}

// markWaiting marks r.Token as the waiting writer of r.Name, unless another writer's mark
// lasts: one update.
func (s *Store) markWaiting(ctx context.Context, r guard.Request, now instant) error {
	mark := max(watchdog.Place(QueueTimeout, r.TTL), minMark)
	_, err := s.coll.UpdateOne(ctx,
		bson.D{
			{Key: fieldID, Value: r.Name},
			{Key: "$or", Value: bson.A{
				bson.D{{Key: fieldNext + ".t", Value: r.Token}},
				noWriterWaits(now),
			}},
		},
		bson.D{{Key: "$set", Value: bson.D{{Key: fieldNext, Value: bson.D{
			{Key: "t", Value: r.Token}, {Key: "e", Value: expiry(now.latest(), mark)},
		}}}}})
	return err
}

// busyWriter answers a waiting writer that found r.Name busy: it reads the document, takes
// out shared entries whose lease ran out (a dead reader's) and reports again = true when that
// may have freed the name for another try, or else marks r.Token as the waiting writer (unless
// its mark lasts for long enough still) and returns the busy answer with how long the holders
// stay: two round trips, or three when it marks.
func (s *Store) busyWriter(ctx context.Context, r guard.Request, now instant) (again bool, err error) {
	var d infoDoc
	err = s.coll.FindOne(ctx, bson.D{{Key: fieldID, Value: r.Name}}).Decode(&d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return true, nil // reclaimed meanwhile
	case err != nil:
		return false, err
	}
	if expired := d.expiredEntries(now); len(expired) > 0 {
		if err := s.prune(ctx, r.Name, expired, now); err != nil {
			return false, err
		}
		if !d.held(now) && len(expired) == len(d.Shared) {
			return true, nil
		}
	}
	mark := max(watchdog.Place(QueueTimeout, r.TTL), minMark)
	if d.Next.Token != r.Token || d.Next.Expires.Sub(now.earliest()) < mark/2 {
		if err := s.markWaiting(ctx, r, now); err != nil {
			return false, err
		}
	}
	busy := &guard.BusyError{Name: r.Name}
	for _, h := range d.holders(now) {
		busy.Remaining = max(busy.Remaining, h.Remaining) // a writer waits for every holder
	}
	return false, busy
}

// sharedTries bounds the grants a shared Acquire sends: the first, and one after each read
// that found the way clear (expired entries taken out, the epoch learned).
const sharedTries = 3

// acquireShared grants r, a shared request, in one findAndModify when the Store knows the
// name's epoch (it granted a shared hold of it before) or the name has no document yet; else,
// and when the grant finds the name busy, it reads the document: to learn the epoch, to take
// out entries whose lease ran out, to find its own entry (a retried request), or to say how
// long the name stays busy.
func (s *Store) acquireShared(ctx context.Context, r guard.Request, now instant) (uint64, error) {
	k := entryPath(r.Token)
	expires := expiry(now.latest(), r.TTL)
	epoch, known := s.epochs.get(r.Name)
	var floor int64 // the counter the document had at the last read
	for try := 0; ; try++ {
		counter := int64(1) // for a new document, whose epoch is now
		if known {
			counter = max(now.latest().UnixMicro()-epoch, floor+1)
		}
		filter := bson.D{
			{Key: fieldID, Value: r.Name},
			{Key: k, Value: bson.D{{Key: "$exists", Value: false}}},
			{Key: fieldFence, Value: bson.D{{Key: "$lt", Value: counter}}},
			{Key: "$and", Value: bson.A{exclusiveFree(now), noWriterWaits(now)}},
		}
		if r.Limit > 0 {
			filter = append(filter, bson.E{Key: "$or", Value: bson.A{
				bson.D{{Key: fieldCount, Value: bson.D{{Key: "$lt", Value: r.Limit}}}},
				bson.D{{Key: fieldCount, Value: bson.D{{Key: "$exists", Value: false}}}},
			}})
		}
		update := bson.D{
			{Key: "$set", Value: bson.D{
				{Key: fieldOwner, Value: ""},
				{Key: fieldFence, Value: counter},
				{Key: k, Value: sharedEntry{
					Owner: r.Token, Fence: counter, Expires: expires, Acquired: now.t,
					Instance: display.Text(r.Instance), Label: display.Text(r.Label), Value: display.Text(r.Value),
				}},
			}},
			{Key: "$inc", Value: bson.D{{Key: fieldCount, Value: int64(1)}}},
			{Key: "$max", Value: bson.D{{Key: fieldSharedEnd, Value: expires}}},
			{Key: "$setOnInsert", Value: bson.D{
				{Key: fieldEpoch, Value: now.latest().UnixMicro()},
				{Key: fieldExpires, Value: now.t},
			}},
		}
		var doc struct {
			Fence int64 `bson:"fence"`
			Epoch int64 `bson:"epoch"`
		}
		err := s.coll.FindOneAndUpdate(ctx, filter, update,
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&doc)
		if err == nil {
			s.epochs.put(r.Name, doc.Epoch)
			return uint64(doc.Epoch) + uint64(doc.Fence), nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return 0, err
		}
		// Busy, or in the way: an expired entry, an epoch not known, a counter too low.
		var d infoDoc
		err = s.coll.FindOne(ctx, bson.D{{Key: fieldID, Value: r.Name}}).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue // reclaimed meanwhile: the next try inserts it
		}
		if err != nil {
			return 0, err
		}
		epoch, known, floor = d.Epoch, true, d.Fence
		s.epochs.put(r.Name, d.Epoch)
		if e, ok := d.Shared[entryKey(r.Token)]; ok && e.Owner == r.Token && e.Expires.After(now.earliest()) {
			return s.renewShared(ctx, r, d, e, expires, now)
		}
		expired := d.expiredEntries(now)
		if len(expired) > 0 {
			if err := s.prune(ctx, r.Name, expired, now); err != nil {
				return 0, err
			}
		}
		busy := d.busyFor(r, now) // counts live entries only: pruning does not change it
		if busy != nil || try+1 == sharedTries {
			if busy == nil {
				busy = &guard.BusyError{Name: r.Name}
			}
			return 0, busy
		}
	}
}

// renewShared answers a retried request whose entry d holds already: it sets the entry's
// lease again, and returns its fence.
func (s *Store) renewShared(ctx context.Context, r guard.Request, d infoDoc, e sharedEntry, expires time.Time,
	now instant,
) (uint64, error) {
	k := entryPath(r.Token)
	res, err := s.coll.UpdateOne(ctx,
		bson.D{{Key: fieldID, Value: r.Name}, {Key: k + ".o", Value: r.Token}, {Key: k + ".e", Value: bson.D{{Key: "$gt", Value: now.earliest()}}}},
		bson.D{
			{Key: "$set", Value: bson.D{{Key: k + ".e", Value: expires}}},
			{Key: "$max", Value: bson.D{{Key: fieldSharedEnd, Value: expires}}},
		})
	switch {
	case err != nil:
		return 0, err
	case res.MatchedCount == 0:
		return 0, &guard.BusyError{Name: r.Name} // it ran out in between
	}
	return uint64(d.Epoch) + uint64(e.Fence), nil
}

// prune takes the entries of expired out of name's shared holders, each only while it is the
// same grant and still over.
func (s *Store) prune(ctx context.Context, name string, expired map[string]sharedEntry, now instant) error {
	filter := bson.D{{Key: fieldID, Value: name}}
	unset := bson.D{}
	for key, e := range expired {
		path := fieldShared + "." + key
		filter = append(filter,
			bson.E{Key: path + ".f", Value: e.Fence},
			bson.E{Key: path + ".e", Value: bson.D{{Key: "$lte", Value: now.earliest()}}})
		unset = append(unset, bson.E{Key: path, Value: ""})
	}
	_, err := s.coll.UpdateOne(ctx, filter, bson.D{
		{Key: "$unset", Value: unset},
		{Key: "$inc", Value: bson.D{{Key: fieldCount, Value: -int64(len(expired))}}},
	})
	return err
}

// expiredEntries returns the shared entries of d whose lease is over at now.
func (d infoDoc) expiredEntries(now instant) map[string]sharedEntry {
	var out map[string]sharedEntry
	for key, e := range d.Shared {
		if !e.Expires.After(now.earliest()) {
			if out == nil {
				out = make(map[string]sharedEntry)
			}
			out[key] = e
		}
	}
	return out
}

// busyFor returns why d keeps shared request r out at now, as a *guard.BusyError with how long
// it stays out when that is known, or nil when nothing does.
func (d infoDoc) busyFor(r guard.Request, now instant) *guard.BusyError {
	if d.Owner != "" && d.Expires.After(now.earliest()) {
		return &guard.BusyError{Name: r.Name, Remaining: d.Expires.Sub(now.earliest())}
	}
	if d.Next.Token != "" && d.Next.Expires.After(now.earliest()) {
		return &guard.BusyError{Name: r.Name} // behind a waiting writer: until it has come and gone
	}
	if r.Limit <= 0 {
		return nil
	}
	live := 0
	var first time.Duration
	for _, e := range d.Shared {
		if left := e.Expires.Sub(now.earliest()); left > 0 {
			live++
			if first == 0 || left < first {
				first = left
			}
		}
	}
	if live >= r.Limit {
		return &guard.BusyError{Name: r.Name, Remaining: first}
	}
	return nil
}

// maxEpochs bounds how many names' epochs a Store remembers; past it, it forgets them all and
// learns them again, one read each.
const maxEpochs = 1 << 14

// epochs remembers the epochs of lock documents: a shared grant chooses its counter from it.
type epochs struct {
	mu sync.Mutex // protects m
	m  map[string]int64
}

func (e *epochs) get(name string) (int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	epoch, ok := e.m[name]
	return epoch, ok
}

func (e *epochs) put(name string, epoch int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil || len(e.m) >= maxEpochs {
		e.m = make(map[string]int64)
	}
	e.m[name] = epoch
}
