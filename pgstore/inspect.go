package pgstore

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/guardlock/guard"
)

// Inspect returns what the table holds of name (sql/inspect.sql): its newest holder (by
// fence) and how many hold it and wait for it, or that it is free, with the fence, instance,
// label, value and grant time of its last grant. A name never taken, or reclaimed, is free
// with Fence 0. It returns the driver's error.
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	info := guard.LockInfo{Name: name}
	var (
		fence                   *int64
		instance, label, value  *string
		acquired                *time.Time
		remaining, holders, wai int64
	)
	err := s.pool.QueryRow(ctx, s.sql.inspect, name).Scan(
		&info.Held, &info.Kept, &fence, &instance, &label, &value, &info.Shared, &acquired, &remaining, &holders, &wai)
	if err != nil {
		return guard.LockInfo{}, err
	}
	if fence == nil {
		return guard.LockInfo{Name: name}, nil
	}
	info.Fence, info.Instance, info.Label, info.Value = uint64(*fence), deref(instance), deref(label), deref(value)
	if acquired != nil {
		info.AcquiredAt = *acquired
	}
	info.Holders, info.Waiting = int(holders), int(wai)
	finish(&info, remaining)
	return info, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// finish sets the fields of info that follow from Held and the remaining lease in µs.
func finish(info *guard.LockInfo, remaining int64) {
	info.Kept = info.Held && info.Kept
	info.Shared = info.Held && info.Shared
	if info.Held {
		info.Remaining = time.Duration(remaining) * time.Microsecond
	}
}

// List returns up to limit holders (at most maxPage) of names that start with prefix, one
// entry each — a shared name has one per holder, each with the name's Holders — in name
// (byte) and fence order, after cursor (sql/list.sql); next is the last entry's name and
// fence when more follow, "" at the end. A kept hold (a MinHold window) is listed as held.
// It returns the driver's error.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = min(max(limit, 1), maxPage)
	afterName, afterFence := parseCursor(cursor)
	var rows pgx.Rows
	var err error
	if upper, ok := successor(prefix); ok {
		rows, err = s.pool.Query(ctx, s.sql.list, prefix, upper, afterName, afterFence, limit+1)
	} else {
		rows, err = s.pool.Query(ctx, s.sql.listAll, prefix, afterName, afterFence, limit+1)
	}
	if err != nil {
		return nil, "", err
	}
	var (
		page               []guard.LockInfo
		info               guard.LockInfo
		remaining, holders int64
	)
	_, err = pgx.ForEachRow(rows,
		[]any{&info.Name, &info.Kept, &info.Fence, &info.Instance, &info.Label, &info.Value, &info.Shared,
			&info.AcquiredAt, &remaining, &holders},
		func() error {
			info.Held, info.Holders = true, int(holders)
			finish(&info, remaining)
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

// parseCursor reads a cursor of List: a name, NUL and a fence. A cursor without a fence (a
// name alone, as earlier versions gave) means after every holder of that name.
func parseCursor(cursor string) (string, int64) {
	name, fence, ok := strings.Cut(cursor, "\x00")
	if !ok {
		if cursor == "" {
			return "", 0
		}
		return cursor, math.MaxInt64
	}
	f, err := strconv.ParseInt(fence, 10, 64)
	if err != nil {
		return name, math.MaxInt64
	}
	return name, f
}

// maxPage is the most locks one List call returns.
const maxPage = 1000

// successor returns the least string above every string that starts with prefix: prefix with
// its last code point replaced by the next one (UTF-8 sorts bytewise as code points do, and
// no encoding is a prefix of another). A last code point with no successor is dropped and the
// one before it moves on instead. It reports false when there is no such string (an empty
// prefix, or one of U+10FFFF only).
func successor(prefix string) (string, bool) {
	for prefix != "" {
		r, size := utf8.DecodeLastRuneInString(prefix)
		prefix = prefix[:len(prefix)-size]
		switch {
		case r == utf8.RuneError && size <= 1:
			continue // not UTF-8: no name has it, so cannot start with it either
		case r == utf8.MaxRune:
			continue
		case r+1 == 0xD800: // surrogates are not characters
			return prefix + string(rune(0xE000)), true
		}
		return prefix + string(r+1), true
	}
	return "", false
}

// ForceRelease frees name's holder with fence — or every holder, fence 0 — held or kept for
// a MinHold window, keeping the name's fence, hands what that frees to the first waiters that
// fit, and notifies listeners: one call of the table's force_release function
// (sql/functions.sql). The notice carries no token: no Guard released the lock, so every
// Guard waiting for it is to be woken. It returns guard.ErrNotHeld when name is free, a
// *guard.ChangedHandsError when it is held with another fence, or the driver's error.
func (s *Store) ForceRelease(ctx context.Context, name string, fence uint64) error {
	want := int64(-1) // no row has it
	if fence <= math.MaxInt64 {
		want = int64(fence)
	}
	var (
		found    int64
		released bool
	)
	err := s.pool.QueryRow(ctx, s.sql.forceRelease, name, want, payload(name, "")).Scan(&found, &released)
	switch {
	case err != nil:
		return err
	case found == 0 && !released:
		return guard.ErrNotHeld
	case !released:
		return &guard.ChangedHandsError{Name: name, Fence: fence, Found: uint64(found)}
	}
	return nil
}

// Reclaim deletes the rows of names that have been free — released, or with leases that ran
// out — for longer than idle by the database's clock, and the rows of holders and waiters
// dead that long, and returns how many names it deleted: a service that locks one name per
// request keeps one row per name it ever locked until then.
// Run it now and then (daily, say) with idle of an hour or more. The next acquisition of a
// reclaimed name takes a fence from the database's clock, above the row's last one (see
// MinReclaimIdle). It returns ErrIdleTooShort when idle is under MinReclaimIdle, or the
// driver's error.
func (s *Store) Reclaim(ctx context.Context, idle time.Duration) (int64, error) {
	if idle < MinReclaimIdle {
		return 0, fmt.Errorf("%w: %v, less than %v", ErrIdleTooShort, idle, MinReclaimIdle)
	}
	var names int64
	if err := s.pool.QueryRow(ctx, s.sql.reclaim, micros(idle)).Scan(&names); err != nil {
		return 0, err
	}
	return names, nil
}
