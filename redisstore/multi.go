package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/guardlock/guard"
)

// undoTimeout bounds the releases that undo the slot groups AcquireAll took before one it
// could not take.
const undoTimeout = 5 * time.Second

// AcquireAll takes every request's name, or none (guard.Batcher). The names of one Cluster slot
// — all of them, on a single node or a Sentinel-managed master — are taken in one EVALSHA of
// acquire_all.lua: all or none, one round trip. Names that span slots are taken with one
// script per slot, sent at once (a round trip per slot, on the slots' masters side by side);
// when a slot's names cannot all be had, the slots taken are released — a round trip per name
// — and AcquireAll returns the busy answer of the first such slot in the order of reqs,
// holding nothing. It queues nobody, so it waits for nobody and no order is needed. A name
// asked for twice is a *guard.NameError. It returns the fences in the order of reqs, a
// *guard.BusyError, or the driver's error (the caller then gives back every token: a slot may
// have been taken although its reply was lost).
func (s *Store) AcquireAll(ctx context.Context, reqs []guard.Request) ([]uint64, error) {
	for i, r := range reqs {
		if r.TTL <= 0 {
			return nil, fmt.Errorf("redisstore: lease %v is not positive", r.TTL)
		}
		for _, earlier := range reqs[:i] {
			if earlier.Name == r.Name {
				return nil, &guard.NameError{Name: r.Name, Reason: "asked for twice in one AcquireAll"}
			}
		}
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	if err := s.checkEviction(ctx); err != nil {
		return nil, err
	}
	groups := s.slotGroups(reqs)
	fences := make([]uint64, len(reqs))
	if len(groups) == 1 {
		if err := s.acquireGroup(ctx, reqs, groups[0], fences); err != nil {
			return nil, err
		}
		return fences, nil
	}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, group := range groups {
		wg.Go(func() { errs[i] = s.acquireGroup(ctx, reqs, group, fences) })
	}
	wg.Wait()
	var taken [][]int
	var busy, failed error
	for i, err := range errs {
		var b *guard.BusyError
		switch {
		case err == nil:
			taken = append(taken, groups[i])
		case errors.As(err, &b):
			if busy == nil {
				busy = err
			}
		case failed == nil:
			failed = err
		}
	}
	if busy == nil && failed == nil {
		return fences, nil
	}
	s.undo(ctx, reqs, taken)
	if failed != nil {
		return nil, failed // the caller gives back every token: a slot may be held unanswered
	}
	return nil, busy
}

// slotGroups returns the indexes of reqs grouped by Cluster slot, each group and the groups
// in the order of reqs; one group when the server is not a Cluster.
func (s *Store) slotGroups(reqs []guard.Request) [][]int {
	if s.cluster == nil {
		all := make([]int, len(reqs))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	var groups [][]int
	slots := make([]uint16, 0, len(reqs))
	for i, r := range reqs {
		slot := keySlot(s.lockKey(r.Name))
		at := -1
		for j, sl := range slots {
			if sl == slot {
				at = j
				break
			}
		}
		if at < 0 {
			slots = append(slots, slot)
			groups = append(groups, nil)
			at = len(groups) - 1
		}
		groups[at] = append(groups[at], i)
	}
	return groups
}

// acquireGroup runs acquire_all.lua for the requests at group, which share a slot, and puts
// their fences in fences.
func (s *Store) acquireGroup(ctx context.Context, reqs []guard.Request, group []int, fences []uint64) error {
	keys := make([]string, 0, 6*len(group))
	args := make([]any, 0, 1+7*len(group))
	args = append(args, retentionArg)
	for _, i := range group {
		r := reqs[i]
		keys = append(keys, s.keys(r.Name)[:6]...)
		args = append(args, r.Token, millis(r.TTL), r.Instance, r.Label, r.Attempt, r.Value, s.limit(r))
	}
	reply, err := s.run(ctx, acquireAllScript, reqs[group[0]].Name, keys, args...)
	if err != nil {
		return err
	}
	vals, _ := reply.([]any)
	switch {
	case len(vals) == 1+len(group) && vals[0] == int64(1):
		for j, i := range group {
			f, ok := fenceOf(vals[1+j])
			if !ok {
				return fmt.Errorf("%w %v", ErrUnexpectedReply, reply)
			}
			fences[i] = f
		}
		return nil
	case len(vals) == 3 && vals[0] == int64(0):
		at, ok1 := vals[1].(int64)
		pttl, ok2 := vals[2].(int64)
		if ok1 && ok2 && at >= 1 && int(at) <= len(group) {
			return &guard.BusyError{Name: reqs[group[at-1]].Name, Remaining: max(time.Duration(pttl)*time.Millisecond, 0)}
		}
	}
	return fmt.Errorf("%w %v", ErrUnexpectedReply, reply)
}

// undo releases the names of groups, which AcquireAll took, whatever ctx says.
func (s *Store) undo(ctx context.Context, reqs []guard.Request, groups [][]int) {
	if len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	for _, group := range groups {
		for _, i := range group {
			_ = s.release(ctx, reqs[i].Name, reqs[i].Token, 0)
		}
	}
}

// keySlot returns the Redis Cluster slot of key: CRC16 (XMODEM) of its hash tag — the bytes
// between its first '{' and the first '}' after it, when there are any — or of the whole key,
// mod 16384.
func keySlot(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
