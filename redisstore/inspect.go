package redisstore

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
)

// Inspect reports what the server holds of name: one EVALSHA of inspect.lua, which only
// reads. A free name's last fence is known while its fence key lives (about a minute after
// its last lease ended).
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	reply, err := inspectScript.Run(ctx, s.client, s.keys(name)[:3]).Result()
	if err != nil {
		return guard.LockInfo{}, err
	}
	return s.lockInfo(name, reply)
}

// lockInfo reads inspect.lua's reply.
func (s *Store) lockInfo(name string, reply any) (guard.LockInfo, error) {
	v, ok := reply.([]any)
	if !ok || len(v) != 8 {
		return guard.LockInfo{}, fmt.Errorf("%w %v", ErrUnexpectedReply, reply)
	}
	str := func(i int) string { s, _ := v[i].(string); return s }
	num := func(i int) uint64 { n, _ := strconv.ParseUint(str(i), 10, 64); return n }
	waiting, _ := v[7].(int64)
	info := guard.LockInfo{Name: name, Waiting: int(waiting)}
	pttl, _ := v[5].(int64)
	if token, held := v[0].(string); held && pttl > 0 {
		info.Held = true
		info.Kept = token == ""
		info.Fence = num(1)
		info.Instance, info.Label = str(2), str(3)
		if ms := num(4); ms > 0 {
			info.AcquiredAt = time.UnixMilli(int64(ms))
		}
		info.Remaining = time.Duration(pttl) * time.Millisecond
		return info, nil
	}
	info.Fence = num(6)
	return info, nil
}

// List pages through the held locks whose names start with prefix with SCAN (never KEYS):
// MATCH on the lock keys' prefix, TYPE hash to leave fence keys out, COUNT limit; then one
// pipeline of inspect.lua for the page. In a Cluster it scans the masters one after the other,
// in address order.
//
// A page holds whole SCAN steps: a step whose keys would not fit is left for the next page,
// which runs it again from its cursor — SCAN's guarantee (every key that exists from the first
// step to the last is returned) holds for any cursor it gave, whatever changed in between. A
// page never resumes in the middle of a step by counting what it returned: a key released, or
// a resize of the server's table, changes what a step returns, and the count would skip a key
// that stays held. Only a step that alone holds more than limit keys is split: its keys go out
// in order, and the cursor carries the keys already returned, which the step's next run leaves
// out. SCAN may return a key twice when the server resizes its table between pages.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = max(limit, 1)
	nodes, err := s.masters(ctx)
	if err != nil {
		return nil, "", err
	}
	c, err := parseCursor(cursor)
	if err != nil || c.node >= len(nodes) {
		return nil, "", fmt.Errorf("redisstore: bad list cursor %q", cursor)
	}
	pattern := s.matchPattern(prefix)
	var keys []string
	const maxSteps = 16 // SCAN steps per page: a sparse prefix returns a short page, not a slow one
	for step := 0; step < maxSteps; step++ {
		got, next, err := nodes[c.node].ScanType(ctx, c.scan, pattern, int64(limit), "hash").Result()
		if err != nil {
			return nil, "", err
		}
		if len(c.returned) > 0 {
			got = slices.DeleteFunc(got, func(k string) bool { return slices.Contains(c.returned, k) })
		}
		if len(keys)+len(got) > limit {
			if len(keys) > 0 {
				return s.inspectKeys(ctx, keys, prefix, listCursor{node: c.node, scan: c.scan}.String())
			}
			// This step alone holds more than a page.
			slices.Sort(got)
			got = got[:limit]
			c.returned = append(c.returned, got...)
			return s.inspectKeys(ctx, got, prefix, c.String())
		}
		keys = append(keys, got...)
		c = listCursor{node: c.node, scan: next}
		if c.scan == 0 {
			c.node++
			if c.node == len(nodes) {
				return s.inspectKeys(ctx, keys, prefix, "")
			}
		}
	}
	return s.inspectKeys(ctx, keys, prefix, c.String())
}

// inspectKeys inspects the lock keys of a page and keeps the held ones under prefix.
func (s *Store) inspectKeys(ctx context.Context, keys []string, prefix, next string) ([]guard.LockInfo, string, error) {
	type item struct {
		name string
		cmd  *redis.Cmd
	}
	var items []item
	for _, k := range keys {
		if name, ok := s.nameOfKey(k); ok && strings.HasPrefix(name, prefix) {
			items = append(items, item{name: name})
		}
	}
	if len(items) == 0 {
		return nil, next, nil
	}
	run := func(useSHA bool, at []int) {
		_, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, i := range at {
				if useSHA {
					items[i].cmd = inspectScript.EvalSha(ctx, pipe, s.keys(items[i].name)[:3])
				} else {
					items[i].cmd = inspectScript.Eval(ctx, pipe, s.keys(items[i].name)[:3])
				}
			}
			return nil
		})
	}
	all := make([]int, len(items))
	for i := range all {
		all[i] = i
	}
	run(true, all)
	// A master without the script (a restart, SCRIPT FLUSH) answers NOSCRIPT; in a Cluster a
	// page can span masters, and only some of them may lack it. Send just those again with
	// the script itself, which caches it there.
	var retry []int
	for i, it := range items {
		if isNoScript(it.cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		run(false, retry)
	}
	page := make([]guard.LockInfo, 0, len(items))
	for _, it := range items {
		reply, err := it.cmd.Result()
		if err != nil {
			return nil, "", err
		}
		info, err := s.lockInfo(it.name, reply)
		if err != nil {
			return nil, "", err
		}
		if info.Held {
			page = append(page, info)
		}
	}
	return page, next, nil
}

// masters returns a client per master, in address order: the client itself for a single
// node or a Sentinel-managed master.
func (s *Store) masters(ctx context.Context) ([]redis.Cmdable, error) {
	if s.cluster == nil {
		return []redis.Cmdable{s.client}, nil
	}
	var mu sync.Mutex // protects nodes; ForEachMaster calls its function concurrently
	var nodes []*redis.Client
	err := s.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	out := make([]redis.Cmdable, len(nodes))
	for i, n := range nodes {
		out[i] = n
	}
	return out, nil
}

// matchPattern returns the SCAN pattern of the lock keys of names that start with prefix:
// the prefix with glob characters escaped, then '*'.
func (s *Store) matchPattern(prefix string) string {
	key := s.lockKey(prefix)
	key = key[:len(key)-1] // without the closing brace
	if prefix == "" {
		key = s.prefix + "{"
	}
	var b strings.Builder
	for _, r := range key {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('*')
	return b.String()
}

// listCursor is where List goes on: the master's index, SCAN's cursor on it, and the keys
// that earlier pages returned of the step at that cursor (only when one step held more than a
// page).
type listCursor struct {
	node     int
	scan     uint64
	returned []string
}

// String returns the cursor as List hands it out: "node.scan", then ".key" for each key
// returned, in base64url.
func (c listCursor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d.%d", c.node, c.scan)
	for _, k := range c.returned {
		b.WriteByte('.')
		b.WriteString(base64.RawURLEncoding.EncodeToString([]byte(k)))
	}
	return b.String()
}

func parseCursor(s string) (listCursor, error) {
	var c listCursor
	if s == "" {
		return c, nil
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return c, errors.New("bad cursor")
	}
	var err error
	if c.node, err = strconv.Atoi(parts[0]); err != nil || c.node < 0 {
		return c, errors.New("bad cursor")
	}
	if c.scan, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return c, err
	}
	for _, p := range parts[2:] {
		k, err := base64.RawURLEncoding.DecodeString(p)
		if err != nil {
			return c, err
		}
		c.returned = append(c.returned, string(k))
	}
	return c, nil
}

// ForceRelease frees name whoever holds it: one EVALSHA of release.lua, forced, which keeps the
// fence key and hands the name to the first live waiter of its queue, or frees it. It returns
// guard.ErrNotHeld when name is free.
func (s *Store) ForceRelease(ctx context.Context, name string) error {
	return s.release(ctx, name, "", 0)
}
