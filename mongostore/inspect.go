package mongostore

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
)

// infoDoc is what Inspect and List read of a lock document.
type infoDoc struct {
	ID       string    `bson:"_id"`
	Owner    string    `bson:"owner"`
	Fence    int64     `bson:"fence"`
	Epoch    int64     `bson:"epoch"`
	Expires  time.Time `bson:"expires"`
	Acquired time.Time `bson:"acquired"`
	Instance string    `bson:"instance"`
	Label    string    `bson:"label"`
}

func (d infoDoc) info(now time.Time) guard.LockInfo {
	info := guard.LockInfo{
		Name: d.ID, Fence: uint64(d.Epoch) + uint64(d.Fence),
		Instance: d.Instance, Label: d.Label, AcquiredAt: d.Acquired,
	}
	if d.Owner != "" && d.Expires.After(now) {
		info.Held = true
		info.Kept = d.Owner == keptOwner
		info.Remaining = d.Expires.Sub(now)
	}
	return info
}

// Inspect reads name's document: one find by _id. A free name's last fence stays known until
// its document is reclaimed.
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
	return d.info(now), nil
}

// List returns held locks whose names start with prefix, in _id order after the cursor (the
// last name of the previous page): one find, which the _id index serves.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = max(limit, 1)
	now, err := s.clock.now(ctx)
	if err != nil {
		return nil, "", err
	}
	from := bson.D{{Key: "$gte", Value: prefix}}
	if cursor > prefix {
		from = bson.D{{Key: "$gt", Value: cursor}}
	}
	filter := bson.D{
		{Key: fieldID, Value: from},
		{Key: fieldOwner, Value: bson.D{{Key: "$ne", Value: ""}}},
		{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: now}}},
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
		page = append(page, d.info(now))
	}
	if len(docs) < limit {
		return page, "", nil
	}
	return page, page[len(page)-1].Name, nil
}

// ForceRelease frees name whoever holds it, in one update that clears the owner and keeps the
// document and its fence. It returns guard.ErrNotHeld when name is free.
func (s *Store) ForceRelease(ctx context.Context, name string) error {
	now, err := s.clock.now(ctx)
	if err != nil {
		return err
	}
	res, err := s.coll.UpdateOne(ctx,
		bson.D{
			{Key: fieldID, Value: name},
			{Key: fieldOwner, Value: bson.D{{Key: "$ne", Value: ""}}},
			{Key: fieldExpires, Value: bson.D{{Key: "$gt", Value: now}}},
		},
		bson.D{{Key: "$set", Value: bson.D{{Key: fieldOwner, Value: ""}, {Key: fieldExpires, Value: now}}}})
	if err != nil {
		return err
	}
	if res.MatchedCount == 0 {
		return guard.ErrNotHeld
	}
	return nil
}
