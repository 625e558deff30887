package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisJournal keeps the journal on the Redis server of the locks: the current run as a JSON
// string, and for each run a list of its events (JSON), a hash of the fence that claimed each
// task last and a hash of the tasks done, with the fence of their done record. Keys expire a
// day after their last write; a run's keys share a hash tag, so that a script may use them
// all on Redis Cluster.
type redisJournal struct {
	client redis.UniversalClient
}

// redisKeep is how long the journal's keys live after their last write.
const redisKeep = 24 * time.Hour

// The journal's keys.
const redisPrefix = "guard-example:worker:"

func redisRunKey() string             { return redisPrefix + "run" }
func redisEventsKey(id string) string { return redisPrefix + "{" + id + "}:events" }
func redisClaimsKey(id string) string { return redisPrefix + "{" + id + "}:claims" }
func redisDoneKey(id string) string   { return redisPrefix + "{" + id + "}:done" }

// redisLess compares two fences as decimal strings, the shorter being the smaller: a Lua
// number loses precision above 2^53.
const redisLess = `local function less(a, b) return #a < #b or (#a == #b and a < b) end
`

// redisClaim is claim: KEYS claims, done; ARGV task, fence, seconds to keep.
var redisClaim = redis.NewScript(redisLess + `
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 'done' end
local claimed = redis.call('HGET', KEYS[1], ARGV[1])
if claimed and less(ARGV[2], claimed) then return 'stale' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 'ok'`)

// redisFinish is finish: KEYS claims, done, events; ARGV task, fence, seconds to keep, the
// event as a done record, the event as a refused one.
var redisFinish = redis.NewScript(redisLess + `
local done = redis.call('HGET', KEYS[2], ARGV[1])
if done == ARGV[2] then return 'ok' end -- the same record again
local verdict = 'ok'
if done then
	verdict = 'done'
else
	local claimed = redis.call('HGET', KEYS[1], ARGV[1])
	if claimed and less(ARGV[2], claimed) then verdict = 'stale' end
end
if verdict == 'ok' then
	redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
	redis.call('EXPIRE', KEYS[2], ARGV[3])
	redis.call('RPUSH', KEYS[3], ARGV[4])
else
	redis.call('RPUSH', KEYS[3], ARGV[5])
end
redis.call('EXPIRE', KEYS[3], ARGV[3])
return verdict`)

// redisVerdict turns a script's answer into claim's or finish's error.
func redisVerdict(answer string, err error) error {
	switch {
	case err != nil:
		return err
	case answer == "done":
		return errDone
	case answer == "stale":
		return errStale
	}
	return nil
}

func (j redisJournal) setup(context.Context) error { return nil }

func (j redisJournal) current(ctx context.Context) (runRecord, bool, error) {
	b, err := j.client.Get(ctx, redisRunKey()).Bytes()
	if errors.Is(err, redis.Nil) {
		return runRecord{}, false, nil
	}
	if err != nil {
		return runRecord{}, false, err
	}
	var r runRecord
	return r, true, json.Unmarshal(b, &r)
}

func (j redisJournal) begin(ctx context.Context, r runRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return j.client.Set(ctx, redisRunKey(), b, redisKeep).Err()
}

// add appends e to the run's events.
func (j redisJournal) add(ctx context.Context, id string, e event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = j.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.RPush(ctx, redisEventsKey(id), b)
		p.Expire(ctx, redisEventsKey(id), redisKeep)
		return nil
	})
	return err
}

func (j redisJournal) claim(ctx context.Context, id string, task int64, fence uint64) error {
	return redisVerdict(redisClaim.Run(ctx, j.client, []string{redisClaimsKey(id), redisDoneKey(id)},
		task, strconv.FormatUint(fence, 10), int(redisKeep/time.Second)).Text())
}

func (j redisJournal) finish(ctx context.Context, id string, e event) error {
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
	return redisVerdict(redisFinish.Run(ctx, j.client, []string{redisClaimsKey(id), redisDoneKey(id), redisEventsKey(id)},
		e.Key, strconv.FormatUint(e.Fence, 10), int(redisKeep/time.Second), ran, stale).Text())
}

func (j redisJournal) done(ctx context.Context, id string, task int64) (bool, error) {
	return j.client.HExists(ctx, redisDoneKey(id), strconv.FormatInt(task, 10)).Result()
}

func (j redisJournal) events(ctx context.Context, id string) ([]event, error) {
	items, err := j.client.LRange(ctx, redisEventsKey(id), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	events := make([]event, len(items))
	for i, item := range items {
		if err := json.Unmarshal([]byte(item), &events[i]); err != nil {
			return nil, err
		}
	}
	return events, nil
}
