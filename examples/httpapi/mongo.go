package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// MongoStore keeps the balances in a MongoDB collection — in the database the locks are in: a
// document per account, with its balance and the highest fence accepted, whose _id is the
// tenant and the ID as a JSON array. A write is an upsert whose filter asks for a fence no
// higher than the writer's: a stale holder's write finds no document, and its insert collides
// with the existing _id.
type MongoStore struct {
	coll *mongo.Collection
}

// NewMongoStore returns a Store on coll.
func NewMongoStore(coll *mongo.Collection) *MongoStore { return &MongoStore{coll: coll} }

// mongoAccount is an account's document.
type mongoAccount struct {
	ID      string `bson:"_id"`
	Tenant  string `bson:"tenant"`
	Account string `bson:"account"`
	Balance int64  `bson:"balance"`
	Fence   int64  `bson:"fence"`
}

func mongoID(a Account) string {
	b, _ := json.Marshal([]string{a.Tenant, a.ID}) // strings always marshal
	return string(b)
}

// Balance implements Store.
func (s *MongoStore) Balance(ctx context.Context, a Account) (int64, uint64, error) {
	var d mongoAccount
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: mongoID(a)}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, 0, nil
	}
	return d.Balance, uint64(d.Fence), err
}

// Update implements Store.
func (s *MongoStore) Update(ctx context.Context, a Account, fence uint64, change func(int64) (int64, error)) (int64, error) {
	if fence > math.MaxInt64 {
		return 0, fmt.Errorf("accounts: fence %d does not fit an int64", fence)
	}
	balance, _, err := prepare(ctx, s, a, fence, change)
	if err != nil {
		return 0, err
	}
	id := mongoID(a)
	stale := false
	err = write(ctx, func(ctx context.Context) error {
		_, err := s.coll.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: id}, {Key: "fence", Value: bson.D{{Key: "$lte", Value: int64(fence)}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "tenant", Value: a.Tenant}, {Key: "account", Value: a.ID},
				{Key: "balance", Value: balance}, {Key: "fence", Value: int64(fence)}}}}, // the upsert takes _id from the filter
			options.UpdateOne().SetUpsert(true))
		if mongo.IsDuplicateKeyError(err) { // the document has a higher fence: nothing written
			stale, err = true, nil
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	if stale {
		_, seen, err := s.Balance(ctx, a)
		return 0, errors.Join(staleFence(a, fence, seen), err)
	}
	return balance, nil
}
