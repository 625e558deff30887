package redisstore

import (
	"cmp"
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
// reads. For a name held shared it reports the newest holder (the highest fence) and how many
// hold it. A free name's last fence is known while its fence key lives (about a minute after
// its last lease ended).
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	reply, err := inspectScript.Run(ctx, s.client, s.keys(name)[:6], "0").Result()
	if err != nil {
		return guard.LockInfo{}, err
	}
	infos, err := s.lockInfos(name, reply)
	if err != nil {
		return guard.LockInfo{}, err
	}
	return infos[0], nil
}

// lockInfos reads inspect.lua's reply: an entry per holder it reports, or one entry for a free
// name.
func (s *Store) lockInfos(name string, reply any) ([]guard.LockInfo, error) {
	const header, fields = 3, 8
	v, ok := reply.([]any)
	if !ok || len(v) < header || (len(v)-header)%fields != 0 {
		return nil, fmt.Errorf("%w %v", ErrUnexpectedReply, reply)
	}
	str := func(i int) string { s, _ := v[i].(string); return s }
	num := func(i int) uint64 { n, _ := strconv.ParseUint(str(i), 10, 64); return n }
	waiting, _ := v[1].(int64)
	holders, _ := v[2].(int64)
	if len(v) == header {
		return []guard.LockInfo{{Name: name, Waiting: int(waiting), Fence: num(0)}}, nil
	}
	infos := make([]guard.LockInfo, 0, (len(v)-header)/fields)
	for at := header; at < len(v); at += fields {
		pttl, _ := v[at+5].(int64)
		shared, _ := v[at+7].(int64)
		info := guard.LockInfo{
			Name: name, Held: true, Kept: str(at) == "", Fence: num(at + 1),
			Instance: str(at + 2), Label: str(at + 3), Value: str(at + 6), Shared: shared == 1,
			Holders: int(holders), Remaining: time.Duration(pttl) * time.Millisecond, Waiting: int(waiting),
		}
		if ms := num(at + 4); ms > 0 {
			info.AcquiredAt = time.UnixMilli(int64(ms))
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// List pages through the held locks whose names start with prefix with SCAN (never KEYS):
// MATCH on the lock keys' prefix, TYPE hash to leave fence keys and queues out (it finds the
// lock keys of exclusive holders and the holders keys of shared ones), COUNT limit; then one
// pipeline of inspect.lua for the page, which reports each holder of a shared name, in fence
// order. In a Cluster it scans the masters one after the other, in address order.
//
// A page holds whole SCAN steps: a step whose keys or holders would not fit is left for the
// next page, which runs it again from its cursor — SCAN's guarantee (every key that exists from
// the first step to the last is returned) holds for any cursor it gave, whatever changed in
// between. A page never resumes in the middle of a step by counting what it returned: a key
// released, or a resize of the server's table, changes what a step returns, and the count
// would skip a key that stays held. Only the first step of a page is split, when it alone
// holds more than limit keys or holders: its names go out in order, and the cursor carries the
// keys already returned, which the step's next run leaves out, and — when a name's holders
// did not all fit — that name and the last fence returned, above which the next run goes on
// (a later holder has a higher fence). SCAN may return a key twice when the server resizes its
// table between pages.
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
	type step struct {
		at    listCursor // where the step starts
		keys  []string
		split bool // its keys were cut to limit
	}
	var steps []step
	keys := 0
	next := ""          // the cursor after the steps scanned
	const maxSteps = 16 // SCAN steps per page: a sparse prefix returns a short page, not a slow one
	for i := 0; ; i++ {
		if i == maxSteps {
			next = c.String()
			break
		}
		got, after, err := nodes[c.node].ScanType(ctx, c.scan, pattern, int64(limit), "hash").Result()
		if err != nil {
			return nil, "", err
		}
		if len(c.returned) > 0 {
			got = slices.DeleteFunc(got, func(k string) bool { return slices.Contains(c.returned, k) })
		}
		if keys+len(got) > limit {
			if keys > 0 {
				next = c.String()
				break
			}
			// This step alone holds more than a page.
			slices.Sort(got)
			steps = append(steps, step{at: c, keys: got[:limit], split: true})
			next = c.String()
			break
		}
		steps = append(steps, step{at: c, keys: got})
		keys += len(got)
		c = listCursor{node: c.node, scan: after}
		if c.scan == 0 {
			c.node++
			if c.node == len(nodes) {
				break
			}
		}
	}

	// The names of each step, and the keys each was found by.
	type named struct {
		name string
		keys []string
	}
	stepNames := make([][]named, len(steps))
	var all []string
	for i, st := range steps {
		at := map[string]int{}
		for _, k := range st.keys {
			name, ok := s.nameOfKey(k)
			if !ok {
				name, ok = s.nameOfHolders(k)
			}
			if !ok || !strings.HasPrefix(name, prefix) {
				continue
			}
			if j, ok := at[name]; ok {
				stepNames[i][j].keys = append(stepNames[i][j].keys, k)
				continue
			}
			at[name] = len(stepNames[i])
			stepNames[i] = append(stepNames[i], named{name: name, keys: []string{k}})
			all = append(all, name)
		}
	}
	held, err := s.holders(ctx, all)
	if err != nil {
		return nil, "", err
	}
	if len(steps) > 0 && steps[0].at.partial != "" {
		held[steps[0].at.partial] = slices.DeleteFunc(held[steps[0].at.partial], func(info guard.LockInfo) bool {
			return info.Fence <= steps[0].at.after
		})
	}

	var page []guard.LockInfo
	for i, st := range steps {
		entries := 0
		for _, n := range stepNames[i] {
			entries += len(held[n.name])
		}
		if !st.split && len(page)+entries <= limit {
			for _, n := range stepNames[i] {
				page = append(page, held[n.name]...)
			}
			continue
		}
		if i > 0 {
			return page, st.at.String(), nil
		}
		// Split the first step: its names in order, as many holders as fit.
		at := st.at
		at.returned = slices.Clone(at.returned)
		names := stepNames[0]
		slices.SortFunc(names, func(a, b named) int { return strings.Compare(a.name, b.name) })
		for _, n := range names {
			infos := held[n.name]
			room := limit - len(page)
			if len(infos) > room {
				page = append(page, infos[:room]...)
				if room > 0 {
					at.partial, at.after = n.name, infos[room-1].Fence
				}
				return page, at.String(), nil
			}
			page = append(page, infos...)
			at.returned = append(at.returned, n.keys...)
			if at.partial == n.name {
				at.partial, at.after = "", 0
			}
		}
		// Its first keys all fit; its other keys wait for the next page.
		return page, at.String(), nil
	}
	return page, next, nil
}

// holders inspects names in one pipeline and returns the holders of each, in fence order.
func (s *Store) holders(ctx context.Context, names []string) (map[string][]guard.LockInfo, error) {
	held := make(map[string][]guard.LockInfo, len(names))
	if len(names) == 0 {
		return held, nil
	}
	cmds := make([]*redis.Cmd, len(names))
	run := func(useSHA bool, at []int) {
		_, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, i := range at {
				if useSHA {
					cmds[i] = inspectScript.EvalSha(ctx, pipe, s.keys(names[i])[:6], "1")
				} else {
					cmds[i] = inspectScript.Eval(ctx, pipe, s.keys(names[i])[:6], "1")
				}
			}
			return nil
		})
	}
	every := make([]int, len(names))
	for i := range every {
		every[i] = i
	}
	run(true, every)
	// A master without the script (a restart, SCRIPT FLUSH) answers NOSCRIPT; in a Cluster a
	// page can span masters, and only some of them may lack it. Send just those again with
	// the script itself, which caches it there.
	var retry []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		run(false, retry)
	}
	for i, cmd := range cmds {
		reply, err := cmd.Result()
		if err != nil {
			return nil, err
		}
		infos, err := s.lockInfos(names[i], reply)
		if err != nil {
			return nil, err
		}
		infos = slices.DeleteFunc(infos, func(info guard.LockInfo) bool { return !info.Held })
		slices.SortFunc(infos, func(a, b guard.LockInfo) int { return cmp.Compare(a.Fence, b.Fence) })
		held[names[i]] = infos
	}
	return held, nil
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

// listCursor is where List goes on: the master's index, SCAN's cursor on it, and — only when
// one step held more than a page — the keys that earlier pages returned of the step at that
// cursor, and the name whose holders were returned up to the fence after.
type listCursor struct {
	node     int
	scan     uint64
	returned []string
	partial  string
	after    uint64
}

// String returns the cursor as List hands it out: "node.scan", then ".key" for each key
// returned, in base64url, then ".!name!after" with the name in base64url.
func (c listCursor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d.%d", c.node, c.scan)
	for _, k := range c.returned {
		b.WriteByte('.')
		b.WriteString(base64.RawURLEncoding.EncodeToString([]byte(k)))
	}
	if c.partial != "" {
		fmt.Fprintf(&b, ".!%s!%d", base64.RawURLEncoding.EncodeToString([]byte(c.partial)), c.after)
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
		if rest, ok := strings.CutPrefix(p, "!"); ok {
			name, after, ok := strings.Cut(rest, "!")
			n, err := base64.RawURLEncoding.DecodeString(name)
			if !ok || err != nil || len(n) == 0 {
				return c, errors.New("bad cursor")
			}
			if c.after, err = strconv.ParseUint(after, 10, 64); err != nil {
				return c, err
			}
			c.partial = string(n)
			continue
		}
		k, err := base64.RawURLEncoding.DecodeString(p)
		if err != nil {
			return c, err
		}
		c.returned = append(c.returned, string(k))
	}
	return c, nil
}

// ForceRelease frees name's holder with fence (0: every holder): one EVALSHA of force.lua,
// which checks the fence, keeps the fence key and hands what it frees to the first live
// waiters of its queue that fit. It returns guard.ErrNotHeld when name is free, a
// *guard.ChangedHandsError (with the newest holder's fence) when no holder has fence, or the
// driver's error.
func (s *Store) ForceRelease(ctx context.Context, name string, fence uint64) error {
	keys := s.keys(name)
	reply, err := s.run(ctx, forceScript, name, keys[:6], strconv.FormatUint(fence, 10), keys[6], retentionArg)
	if err != nil {
		return err
	}
	switch v := reply.(type) {
	case int64:
		switch v {
		case 0:
			return guard.ErrNotHeld
		case 1:
			return nil
		}
	case []any:
		if len(v) == 2 && v[0] == int64(2) {
			if found, ok := fenceOf(v[1]); ok {
				return &guard.ChangedHandsError{Name: name, Fence: fence, Found: found}
			}
		}
		if notices, ok := handOvers(name, "", v); ok {
			for _, n := range notices {
				s.handedOver(n)
			}
			return nil
		}
	}
	return fmt.Errorf("%w %v", ErrUnexpectedReply, reply)
}
