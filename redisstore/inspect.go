package redisstore

import (
	"context"
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
// in address order. The cursor is opaque: the master's index, SCAN's cursor, and how many
// matches of that SCAN step earlier pages took (a page never holds more than limit). SCAN
// returns every key that exists from the first page to the last, and may return one twice
// when the server resizes its key table in between.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = max(limit, 1)
	nodes, err := s.masters(ctx)
	if err != nil {
		return nil, "", err
	}
	node, scan, skip, err := parseCursor(cursor)
	if err != nil || node >= len(nodes) {
		return nil, "", fmt.Errorf("redisstore: bad list cursor %q", cursor)
	}
	pattern := s.matchPattern(prefix)
	var keys []string
	const maxSteps = 16 // SCAN steps per page: a sparse prefix returns a short page, not a slow one
	for step := 0; step < maxSteps && len(keys) < limit; step++ {
		got, next, err := nodes[node].ScanType(ctx, scan, pattern, int64(limit), "hash").Result()
		if err != nil {
			return nil, "", err
		}
		got = got[min(skip, len(got)):]
		if room := limit - len(keys); len(got) > room {
			keys = append(keys, got[:room]...)
			skip += room
			return s.inspectKeys(ctx, keys, prefix, formatCursor(node, scan, skip))
		}
		keys = append(keys, got...)
		scan, skip = next, 0
		if scan == 0 {
			node++
			if node == len(nodes) {
				return s.inspectKeys(ctx, keys, prefix, "")
			}
		}
	}
	return s.inspectKeys(ctx, keys, prefix, formatCursor(node, scan, skip))
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

func formatCursor(node int, scan uint64, skip int) string {
	return fmt.Sprintf("%d.%d.%d", node, scan, skip)
}

func parseCursor(c string) (node int, scan uint64, skip int, err error) {
	if c == "" {
		return 0, 0, 0, nil
	}
	parts := strings.Split(c, ".")
	if len(parts) != 3 {
		return 0, 0, 0, fmt.Errorf("bad cursor")
	}
	if node, err = strconv.Atoi(parts[0]); err != nil || node < 0 {
		return 0, 0, 0, fmt.Errorf("bad cursor")
	}
	if scan, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return 0, 0, 0, err
	}
	if skip, err = strconv.Atoi(parts[2]); err != nil || skip < 0 {
		return 0, 0, 0, fmt.Errorf("bad cursor")
	}
	return node, scan, skip, nil
}

// ForceRelease frees name whoever holds it: one EVALSHA of release.lua, forced, which keeps the
// fence key and hands the name to the first live waiter of its queue, or frees it. It returns
// guard.ErrNotHeld when name is free.
func (s *Store) ForceRelease(ctx context.Context, name string) error {
	return s.release(ctx, name, "", 0)
}
