package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/guardlock/guard"
)

// Inspect returns what the table says of name: its newest live holder (by fence) and how
// many hold it and wait for it, or, once it is free, the fence, instance, label, value and
// grant time of its last grant. A name without a row (never taken, or reclaimed) is free with
// Fence 0.
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	info := guard.LockInfo{Name: name}
	found := false
	err := s.query(ctx, fill(s.inspect, "{name}", bin(name)), func(rows *sql.Rows) error {
		found = true
		var held bool
		var holders, waiting int
		if err := scanInfo(rows, &info, []any{&held}, &holders, &waiting); err != nil {
			return err
		}
		if !held {
			info.Held, info.Kept, info.Shared, info.Remaining = false, false, false, 0
		}
		info.Holders, info.Waiting = holders, waiting
		return nil
	})
	if err != nil || !found {
		return guard.LockInfo{Name: name}, err
	}
	return info, nil
}

// scanInfo reads the columns of a hold — kept, fence, instance, label, value, shared, when it
// was acquired (µs since the epoch), the rest of its lease in µs — into info, after the
// columns in before and before those in after.
func scanInfo(rows *sql.Rows, info *guard.LockInfo, before []any, after ...any) error {
	var (
		kept, shared     bool
		acquired, remain int64
	)
	dest := append(before, &kept, &info.Fence, &info.Instance, &info.Label, &info.Value, &shared, &acquired, &remain)
	if err := rows.Scan(append(dest, after...)...); err != nil {
		return err
	}
	info.AcquiredAt = time.UnixMicro(acquired)
	info.Held = remain > 0
	if info.Held {
		info.Kept, info.Shared = kept, shared
		info.Remaining = time.Duration(remain) * time.Microsecond
	}
	return nil
}

// maxList is the most locks one List page returns.
const maxList = 10000

// List returns the live holds of the names that start with prefix — one entry per holder,
// with the name's Holders — in name (byte by byte) and fence order, after cursor, at most
// limit of them (1 to 10000), and, when more follow, the cursor of the next page: the last
// entry's name, NUL and fence (a name alone, as earlier versions gave, means after every
// holder of that name). It reads a range of the primary key, so a prefix's wildcards mean
// nothing.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = min(max(limit, 1), maxList)
	afterName, after := cursor, uint64(math.MaxUint64)
	if name, fence, ok := strings.Cut(cursor, "\x00"); ok {
		afterName = name
		if f, err := strconv.ParseUint(fence, 10, 64); err == nil {
			after = f
		}
	} else if cursor == "" {
		after = 0
	}
	q := fill(s.list, "{from}", bin(prefix), "{to}", bin(prefixEnd(prefix)), "{cursor}", bin(afterName),
		"{after}", strconv.FormatUint(after, 10), "{limit}", strconv.Itoa(limit+1))
	var page []guard.LockInfo
	err := s.query(ctx, q, func(rows *sql.Rows) error {
		var (
			name    []byte
			info    guard.LockInfo
			holders int
		)
		if err := scanInfo(rows, &info, []any{&name}, &holders); err != nil {
			return err
		}
		info.Name, info.Holders = string(name), holders
		page = append(page, info)
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	if len(page) <= limit {
		return page, "", nil
	}
	page = page[:limit]
	last := page[limit-1]
	return page, last.Name + "\x00" + strconv.FormatUint(last.Fence, 10), nil
}

// prefixEnd returns the least string above every string that starts with prefix, or "\xff"
// when there is none: no lock name, being UTF-8, contains the byte 0xff.
func prefixEnd(prefix string) string {
	b := []byte(prefix)
	for len(b) > 0 && b[len(b)-1] == 0xff {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return "\xff"
	}
	b[len(b)-1]++
	return string(b)
}

// ForceRelease frees name's holder with fence — or every holder, fence 0 — held or kept for
// a MinHold window, keeping the name's fence, and hands what that frees to the first waiters
// that fit: one CALL of the table's force_release procedure. The holder's next renewal finds
// its token gone. It returns guard.ErrNotHeld when name is free, a *guard.ChangedHandsError
// when no holder has fence, or the driver's error.
func (s *Store) ForceRelease(ctx context.Context, name string, fence uint64) error {
	q := fill(s.forceRelease, "{name}", bin(name), "{fence}", strconv.FormatUint(fence, 10))
	var (
		found    uint64
		released bool
	)
	if err := s.call(ctx, q, false, &found, &released); err != nil {
		return err
	}
	switch {
	case found == 0:
		return guard.ErrNotHeld
	case !released:
		return &guard.ChangedHandsError{Name: name, Fence: fence, Found: found}
	}
	return nil
}

// MinReclaimIdle is the shortest idle time Reclaim accepts.
const MinReclaimIdle = time.Minute

// ErrIdleTooShort reports a Reclaim with an idle time under MinReclaimIdle.
var ErrIdleTooShort = errors.New("mysqlstore: reclaim idle time too short")

// reclaimBatch is how many rows Reclaim deletes per statement.
const reclaimBatch = 200

// Reclaim deletes the rows of names that have been free for longer than idle by the
// database's clock — released, or their leases ended — with their holders' and waiters' dead
// rows, and returns how many names it deleted. A
// table keeps one row per name ever locked; a service that locks names made of unbounded
// values (a request id, a user) runs Reclaim now and then, from one instance (any works).
// Held names and MinHold windows are never deleted, nor a row taken while Reclaim runs.
//
// A deleted row loses its fence: the next acquisition of the name starts again from the
// database's clock in microseconds, which is above every fence the name had as long as that
// clock has not stepped back by more than idle. That is why idle must be at least
// MinReclaimIdle (a minute); Reclaim returns ErrIdleTooShort, and deletes nothing, otherwise.
//
// Reclaim reads candidates a page at a time without locking and deletes each page by primary
// key, so it never holds locks on more than reclaimBatch rows at once.
func (s *Store) Reclaim(ctx context.Context, idle time.Duration) (int64, error) {
	if idle < MinReclaimIdle {
		return 0, fmt.Errorf("%w: %v, less than %v", ErrIdleTooShort, idle, MinReclaimIdle)
	}
	var (
		deleted int64
		cursor  string
	)
	for {
		var names []string
		q := fill(s.idle, "{cursor}", bin(cursor), "{idle}", micros(idle), "{limit}", strconv.Itoa(reclaimBatch))
		err := s.query(ctx, q, func(rows *sql.Rows) error {
			var name []byte
			err := rows.Scan(&name)
			names = append(names, string(name))
			return err
		})
		if err != nil || len(names) == 0 {
			return deleted, err
		}
		lits := make([]string, len(names))
		for i, n := range names {
			lits[i] = bin(n)
		}
		in := strings.Join(lits, ", ")
		if _, err := s.exec(ctx, fill(s.reclaimDead, "{names}", in, "{idle}", micros(idle)), true); err != nil {
			return deleted, err
		}
		res, err := s.exec(ctx, fill(s.reclaim, "{names}", in, "{idle}", micros(idle)), true)
		if err != nil {
			return deleted, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return deleted, err
		}
		deleted += n
		if len(names) < reclaimBatch {
			return deleted, nil
		}
		cursor = names[len(names)-1]
	}
}
