package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// mongoJournal keeps the journal in three collections of the MongoDB database of the locks:
// worker_runs, whose document "current" is the current run; worker_events, a document per
// event; and worker_tasks, a document per task of a run with the fence that claimed it last
// and whether it is done. A claim and a done record are each an upsert whose filter asks for
// a task not done and a fence no higher than the writer's: a stale holder's finds no
// document, and its insert collides with the existing _id.
type mongoJournal struct {
	runs, log, tasks *mongo.Collection
}

func newMongoJournal(db *mongo.Database) mongoJournal {
	return mongoJournal{runs: db.Collection("worker_runs"), log: db.Collection("worker_events"), tasks: db.Collection("worker_tasks")}
}

// mongoTask is a task's document.
type mongoTask struct {
	ID    string `bson:"_id"` // the run's ID and the task's, "run/task"
	Fence int64  `bson:"fence"`
	Done  bool   `bson:"done"`
}

// mongoRun and mongoEvent are the documents.
type mongoRun struct {
	ID      string    `bson:"_id"`
	Run     string    `bson:"run"`
	Epoch   time.Time `bson:"epoch"`
	Windows int       `bson:"windows"`
	Window  int64     `bson:"window"` // nanoseconds
	Tasks   int       `bson:"tasks"`
	Tenants int       `bson:"tenants"`
	Imports int       `bson:"imports"`
}

type mongoEvent struct {
	Run      string    `bson:"run"`
	Kind     int       `bson:"kind"`
	Item     int64     `bson:"item"`
	Instance string    `bson:"instance"`
	Fence    int64     `bson:"fence"`
	Start    time.Time `bson:"start"`
	End      time.Time `bson:"end,omitempty"`
}

func (j mongoJournal) setup(context.Context) error { return nil }

func (j mongoJournal) current(ctx context.Context) (runRecord, bool, error) {
	var d mongoRun
	err := j.runs.FindOne(ctx, bson.D{{Key: "_id", Value: "current"}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return runRecord{}, false, nil
	}
	if err != nil {
		return runRecord{}, false, err
	}
	return runRecord{ID: d.Run, Epoch: d.Epoch, Windows: d.Windows, Window: time.Duration(d.Window), Tasks: d.Tasks,
		Tenants: d.Tenants, Imports: d.Imports}, true, nil
}

func (j mongoJournal) begin(ctx context.Context, r runRecord) error {
	d := mongoRun{ID: "current", Run: r.ID, Epoch: r.Epoch, Windows: r.Windows, Window: int64(r.Window), Tasks: r.Tasks,
		Tenants: r.Tenants, Imports: r.Imports}
	_, err := j.runs.ReplaceOne(ctx, bson.D{{Key: "_id", Value: "current"}}, d, options.Replace().SetUpsert(true))
	return err
}

func (j mongoJournal) add(ctx context.Context, id string, e event) error {
	if e.Fence > math.MaxInt64 {
		return fmt.Errorf("fence %d does not fit an int64", e.Fence)
	}
	_, err := j.log.InsertOne(ctx, mongoEvent{Run: id, Kind: int(e.Kind), Item: e.Key, Instance: e.Instance,
		Fence: int64(e.Fence), Start: e.Start, End: e.End})
	return err
}

// setTask upserts task's document in run id with fence, and done when done, unless the task
// is done or has a higher fence; then it returns the document's state and false.
func (j mongoJournal) setTask(ctx context.Context, id string, task int64, fence uint64, done bool) (taskState, bool, error) {
	if fence > math.MaxInt64 {
		return taskState{}, false, fmt.Errorf("fence %d does not fit an int64", fence)
	}
	key := id + "/" + strconv.FormatInt(task, 10)
	_, err := j.tasks.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: key}, {Key: "done", Value: false}, {Key: "fence", Value: bson.D{{Key: "$lte", Value: int64(fence)}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "fence", Value: int64(fence)}, {Key: "done", Value: done}}}},
		options.UpdateOne().SetUpsert(true))
	if !mongo.IsDuplicateKeyError(err) {
		return taskState{}, err == nil, err
	}
	var d mongoTask
	if err := j.tasks.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d); err != nil {
		return taskState{}, false, err
	}
	return taskState{fence: uint64(d.Fence), done: d.Done}, false, nil
}

func (j mongoJournal) claim(ctx context.Context, id string, task int64, fence uint64) error {
	s, ok, err := j.setTask(ctx, id, task, fence, false)
	if ok || err != nil {
		return err
	}
	_, err = claimTask(s, fence)
	return err
}

func (j mongoJournal) finish(ctx context.Context, id string, e event) error {
	s, ok, err := j.setTask(ctx, id, e.Key, e.Fence, true)
	switch {
	case err != nil:
		return err
	case ok:
		return j.add(ctx, id, e)
	}
	_, again, refused := finishTask(s, e.Fence)
	if again {
		return nil
	}
	e.Kind = staleTask
	return errors.Join(refused, j.add(ctx, id, e))
}

func (j mongoJournal) done(ctx context.Context, id string, task int64) (bool, error) {
	var d mongoTask
	err := j.tasks.FindOne(ctx, bson.D{{Key: "_id", Value: id + "/" + strconv.FormatInt(task, 10)}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	return d.Done, err
}

func (j mongoJournal) events(ctx context.Context, id string) ([]event, error) {
	cur, err := j.log.Find(ctx, bson.D{{Key: "run", Value: id}})
	if err != nil {
		return nil, err
	}
	var docs []mongoEvent
	if err := cur.All(ctx, &docs); err != nil {
		return nil, err
	}
	events := make([]event, len(docs))
	for i, d := range docs {
		events[i] = event{Instance: d.Instance, Kind: kind(d.Kind), Key: d.Item, Fence: uint64(d.Fence), Start: d.Start, End: d.End}
	}
	return events, nil
}
