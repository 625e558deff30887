package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdJournal keeps the journal in the etcd cluster of the locks, under the prefix
// guard-example/worker/: the current run as a JSON value; a key per event, under its run's
// prefix; and a key per task of a run, whose value is the fence that claimed it last and
// whether it is done. The keys stay until deleted, as the SQL journal's rows do.
//
// A claim and a done record are each a compare-and-swap: read the task's key, apply claim's
// or finish's rule to what it holds, and write the new state in a transaction that succeeds
// only if the key's mod revision is still the one read (0: the key is still missing). A done
// record and its event are put in that one transaction, and so is a refused record's event.
// When another writer came in between, the transaction returns the key as it is now, and the
// rule is applied again to that: two holders can never both see a task not done and record it
// done.
type etcdJournal struct {
	kv clientv3.KV
}

// The journal's keys. A run's ID is path-escaped in them, so that no ID spells the prefix of
// another's keys.
const etcdPrefix = "guard-example/worker/"

func etcdRunKey() string { return etcdPrefix + "run" }
func etcdEventsPrefix(id string) string {
	return etcdPrefix + "events/" + url.PathEscape(id) + "/"
}
func etcdTaskKey(id string, task int64) string {
	return etcdPrefix + "tasks/" + url.PathEscape(id) + "/" + strconv.FormatInt(task, 10)
}

// etcdTask is a task key's value.
type etcdTask struct {
	Fence uint64 `json:"fence"`
	Done  bool   `json:"done,omitempty"`
}

// etcdEventKey returns a new key for an event of run id: a random name under the run's
// prefix, since events are never read one by one.
func etcdEventKey(id string) string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails
	return etcdEventsPrefix(id) + hex.EncodeToString(b[:])
}

func (j etcdJournal) setup(context.Context) error { return nil }

func (j etcdJournal) current(ctx context.Context) (runRecord, bool, error) {
	resp, err := j.kv.Get(ctx, etcdRunKey())
	if err != nil || len(resp.Kvs) == 0 {
		return runRecord{}, false, err
	}
	var r runRecord
	return r, true, json.Unmarshal(resp.Kvs[0].Value, &r)
}

func (j etcdJournal) begin(ctx context.Context, r runRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = j.kv.Put(ctx, etcdRunKey(), string(b))
	return err
}

func (j etcdJournal) add(ctx context.Context, id string, e event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = j.kv.Put(ctx, etcdEventKey(id), string(b))
	return err
}

// etcdTaskState returns the state of a task, and the mod revision of its key (0: missing),
// from a Get of the key.
func etcdTaskState(resp *clientv3.GetResponse) (taskState, int64, error) {
	if len(resp.Kvs) == 0 {
		return taskState{}, 0, nil
	}
	var t etcdTask
	if err := json.Unmarshal(resp.Kvs[0].Value, &t); err != nil {
		return taskState{}, 0, err
	}
	return taskState{fence: t.Fence, done: t.Done}, resp.Kvs[0].ModRevision, nil
}

// swap applies rule to the state of task in run id, and writes what it decides in one
// transaction, which succeeds only if the task's key has not changed since it was read; when
// it has, swap applies rule to the key as it is now, and tries again. rule returns the new
// state (nil: leave the key as it is) and the other operations of the transaction (events).
func (j etcdJournal) swap(ctx context.Context, id string, task int64,
	rule func(taskState) (*taskState, []clientv3.Op, error)) error {
	key := etcdTaskKey(id, task)
	resp, err := j.kv.Get(ctx, key)
	if err != nil {
		return err
	}
	for {
		s, rev, err := etcdTaskState(resp)
		if err != nil {
			return err
		}
		next, ops, verdict := rule(s)
		if next != nil {
			b, err := json.Marshal(etcdTask{Fence: next.fence, Done: next.done})
			if err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(key, string(b)))
		}
		if len(ops) == 0 {
			return verdict
		}
		txn, err := j.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(ops...).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return err
		}
		if txn.Succeeded {
			return verdict
		}
		// Another writer changed the task between the read and the write: decide again on
		// what it wrote.
		resp = (*clientv3.GetResponse)(txn.Responses[0].GetResponseRange())
	}
}

func (j etcdJournal) claim(ctx context.Context, id string, task int64, fence uint64) error {
	return j.swap(ctx, id, task, func(s taskState) (*taskState, []clientv3.Op, error) {
		next, err := claimTask(s, fence)
		if err != nil || next == s {
			return nil, nil, err // refused, or the same claim again: nothing to write
		}
		return &next, nil, nil
	})
}

func (j etcdJournal) finish(ctx context.Context, id string, e event) error {
	ran, err := json.Marshal(e)
	if err != nil {
		return err
	}
	refused := e
	refused.Kind = staleTask
	stale, err := json.Marshal(refused)
	if err != nil {
		return err
	}
	return j.swap(ctx, id, e.Key, func(s taskState) (*taskState, []clientv3.Op, error) {
		next, again, err := finishTask(s, e.Fence)
		switch {
		case again:
			return nil, nil, nil // the same record again: accepted once already
		case err != nil:
			// Recorded only if the task is still as read: the refusal's reason is then
			// the one returned.
			return nil, []clientv3.Op{clientv3.OpPut(etcdEventKey(id), string(stale))}, err
		}
		return &next, []clientv3.Op{clientv3.OpPut(etcdEventKey(id), string(ran))}, nil
	})
}

func (j etcdJournal) done(ctx context.Context, id string, task int64) (bool, error) {
	resp, err := j.kv.Get(ctx, etcdTaskKey(id, task))
	if err != nil {
		return false, err
	}
	s, _, err := etcdTaskState(resp)
	return s.done, err
}

func (j etcdJournal) events(ctx context.Context, id string) ([]event, error) {
	resp, err := j.kv.Get(ctx, etcdEventsPrefix(id), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	events := make([]event, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		if err := json.Unmarshal(kv.Value, &events[i]); err != nil {
			return nil, fmt.Errorf("event %s: %w", kv.Key, err)
		}
	}
	return events, nil
}
