package mongostore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
)

// infoDoc is what Inspect and List read of a lock document.
type infoDoc struct {
	ID       string                 `bson:"_id"`
	Owner    string                 `bson:"owner"`
	Fence    int64                  `bson:"fence"`
	Epoch    int64                  `bson:"epoch"`
	Expires  time.Time              `bson:"expires"`
	Acquired time.Time              `bson:"acquired"`
	Instance string                 `bson:"instance"`
	Label    string                 `bson:"label"`
	Value    string                 `bson:"value"`
	Shared   map[string]sharedEntry `bson:"shared"`
	Next     struct {
		Token   string    `bson:"t"`
		Expires time.Time `bson:"e"`
	} `bson:"next"`
}

// fence returns the document's fence: its epoch plus its counter.
func (d infoDoc) fence() uint64 { return uint64(d.Epoch) + uint64(d.Fence) }

// held reports whether an exclusive holder holds (or keeps) d at now.
func (d infoDoc) held(now instant) bool { return d.Owner != "" && d.Expires.After(now.earliest()) }

// info returns what d says of its lock at now: its exclusive holder, or its newest shared
// holder and how many there are; held while a lease has not certainly ended, with Remaining
// up to when it certainly has (see instant).
func (d infoDoc) info(now instant) guard.LockInfo {
	holders := d.holders(now)
	if len(holders) > 0 {
		info := holders[len(holders)-1]
		for i := range holders {
			if holders[i].Fence > info.Fence {
				info = holders[i]
			}
		}
		return info
	}
	return guard.LockInfo{
		Name: d.ID, Fence: d.fence(),
		Instance: d.Instance, Label: d.Label, Value: d.Value, AcquiredAt: d.Acquired,
	}
}

// holders returns what d says of each of its holders at now, in fence order: the exclusive
// one, or the shared ones.
func (d infoDoc) holders(now instant) []guard.LockInfo {
	if d.held(now) {
		return []guard.LockInfo{{
			Name: d.ID, Held: true, Kept: d.Owner == keptOwner, Fence: d.fence(), Holders: 1,
			Instance: d.Instance, Label: d.Label, Value: d.Value, AcquiredAt: d.Acquired,
			Remaining: d.Expires.Sub(now.earliest()),
		}}
	}
	var out []guard.LockInfo
	for _, e := range d.Shared {
		if e.Expires.After(now.earliest()) {
			out = append(out, guard.LockInfo{
				Name: d.ID, Held: true, Kept: e.Owner == keptOwner, Fence: uint64(d.Epoch) + uint64(e.Fence),
				Instance: e.Instance, Label: e.Label, Value: e.Value, Shared: true,
				AcquiredAt: e.Acquired, Remaining: e.Expires.Sub(now.earliest()),
			})
		}
	}
	slices.SortFunc(out, func(a, b guard.LockInfo) int { return cmp.Compare(a.Fence, b.Fence) })
	for i := range out {
		out[i].Holders = len(out)
	}
	return out
}

// waiting returns 1 when a writer's mark lasts at now, else 0.
func (d infoDoc) waiting(now instant) int {
	if d.Next.Token != "" && d.Next.Expires.After(now.earliest()) {
		return 1
	}
	return 0
}

// Inspect reads name's document: one find by _id. A free name's last fence stays known until
// its document is reclaimed. Of a name held shared it reports the newest holder, and how many
// there are; Waiting is 1 while a waiting writer holds later readers back.
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	now, err := s.clock.now(ctx)
	if err != nil {
		return guard.LockInfo{}, err
	}
	var d infoDoc
	err = s.coll.FindOne(ctx, bson.D{{Key: fieldID, Value: name}}).Decode(&d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return guard.LockInfo{Name: name}, nil
	case err != nil:
		return guard.LockInfo{}, err
	}
	info := d.info(now)
	info.Waiting = d.waiting(now)
	return info, nil
}

// List returns the holders of the names that start with prefix — one entry per holder, so
// several for a name held shared — in name and fence order after the cursor (the last
// entry's name, and its fence after a NUL when the page ended inside a name): one find,
// which the _id index serves.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = max(limit, 1)
	now, err := s.clock.now(ctx)
	if err != nil {
		return nil, "", err
	}
	after, afterFence, inside := strings.Cut(cursor, "\x00")
	from := bson.D{{Key: "$gte", Value: prefix}}
	switch {
	case inside && after >= prefix:
		from = bson.D{{Key: "$gte", Value: after}}
	case after > prefix:
		from = bson.D{{Key: "$gt", Value: after}}
	}
	var skipTo uint64
	if inside {
		skipTo, err = strconv.ParseUint(afterFence, 10, 64)
		if err != nil {
			return nil, "", fmt.Errorf("mongostore: bad List cursor %q", cursor)
		}
	}
	filter := bson.D{
		{Key: fieldID, Value: from},
		{Key: "$or", Value: bson.A{
			bson.D{
				{Key: fieldOwner, Value: bson.D{{Key: "$ne", Value: ""}}},
				{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: now.earliest()}}},
			},
			bson.D{
				{Key: fieldCount, Value: bson.D{{Key: "$gt", Value: 0}}},
				{Key: fieldSharedEnd, Value: bson.D{{Key: "$gt", Value: now.earliest()}}},
			},
		}},
	}
	cur, err := s.coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: fieldID, Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, "", err
	}
	var docs []infoDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, "", err
	}
	page := make([]guard.LockInfo, 0, len(docs))
	for _, d := range docs {
		if !strings.HasPrefix(d.ID, prefix) {
			return page, "", nil // past the names under prefix
		}
		for _, h := range d.holders(now) {
			if inside && d.ID == after && h.Fence <= skipTo {
				continue
			}
			if len(page) == limit {
				last := page[len(page)-1]
				return page, last.Name + "\x00" + strconv.FormatUint(last.Fence, 10), nil
			}
			page = append(page, h)
		}
	}
	if len(docs) < limit {
		return page, "", nil
	}
	if len(page) == 0 {
		return page, docs[len(docs)-1].ID, nil
	}
	return page, page[len(page)-1].Name, nil
}

// ForceRelease frees name's holder with fence — the exclusive holder or one shared holder,
// held or kept for a MinHold window — or every holder with fence 0. It reads the document
// first, and its update then matches the document's counter read (which every grant changes)
// and the holder read, so that it changes nothing if anyone took the name in between: two
// round trips, which an operator's command can afford. (A fence is the document's epoch plus
// a counter, and a filter cannot add two fields on every server this store runs on: FerretDB
// has no $expr.) It returns guard.ErrNotHeld when name is free, a *guard.ChangedHandsError
// when no holder has fence, or the driver's error.
func (s *Store) ForceRelease(ctx context.Context, name string, fence uint64) error {
	now, err := s.clock.now(ctx)
	if err != nil {
		return err
	}
	for range sharedTries {
		var d infoDoc
		err := s.coll.FindOne(ctx, bson.D{{Key: fieldID, Value: name}}).Decode(&d)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			return guard.ErrNotHeld
		case err != nil:
			return err
		}
		holders := d.holders(now)
		if len(holders) == 0 {
			return guard.ErrNotHeld
		}
		filter := bson.D{{Key: fieldID, Value: name}, {Key: fieldEpoch, Value: d.Epoch}, {Key: fieldFence, Value: d.Fence}}
		var update bson.D
		switch {
		case d.held(now) && (fence == 0 || fence == d.fence()):
			filter = append(filter, bson.E{Key: fieldOwner, Value: d.Owner})
			update = bson.D{{Key: "$set", Value: bson.D{{Key: fieldOwner, Value: ""}, {Key: fieldExpires, Value: now.t}}}}
		case fence == 0:
			update = bson.D{{Key: "$set", Value: bson.D{{Key: fieldShared, Value: bson.D{}}, {Key: fieldCount, Value: int64(0)}}}}
		default:
			key, ok := d.entryWithFence(fence, now)
			if !ok {
				return &guard.ChangedHandsError{Name: name, Fence: fence, Found: d.info(now).Fence}
			}
			path := fieldShared + "." + key
			filter = append(filter, bson.E{Key: path + ".f", Value: d.Shared[key].Fence})
			update = bson.D{
				{Key: "$unset", Value: bson.D{{Key: path, Value: ""}}},
				{Key: "$inc", Value: bson.D{{Key: fieldCount, Value: int64(-1)}}},
			}
		}
		res, err := s.coll.UpdateOne(ctx, filter, update)
		if err != nil {
			return err
		}
		if res.MatchedCount > 0 {
			return nil
		}
		// The name changed hands between the read and the update: look again.
	}
	info, err := s.Inspect(ctx, name)
	if err != nil {
		return err
	}
	return &guard.ChangedHandsError{Name: name, Fence: fence, Found: info.Fence}
}

// entryWithFence returns the key of d's live shared entry with fence.
func (d infoDoc) entryWithFence(fence uint64, now instant) (string, bool) {
	for key, e := range d.Shared {
		if uint64(d.Epoch)+uint64(e.Fence) == fence && e.Expires.After(now.earliest()) {
			return key, true
		}
	}
	return "", false
}
