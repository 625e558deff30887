package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/guardlock/guard"
)

// Inspect returns what the table holds of name (sql/inspect.sql): its holder, or that it is
// free with its last fence, instance, label and grant time. A name never taken, or reclaimed,
// is free with Fence 0. It returns the driver's error.
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	info := guard.LockInfo{Name: name}
	var remaining int64
	err := s.pool.QueryRow(ctx, s.sql.inspect, name).Scan(
		&info.Held, &info.Kept, &info.Fence, &info.Instance, &info.Label, &info.AcquiredAt, &remaining)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return guard.LockInfo{Name: name}, nil
	case err != nil:
		return guard.LockInfo{}, err
	}
	finish(&info, remaining)
	return info, nil
}

// finish sets the fields of info that follow from Held and the remaining lease in µs.
func finish(info *guard.LockInfo, remaining int64) {
	info.Kept = info.Held && info.Kept
	if info.Held {
		info.Remaining = time.Duration(remaining) * time.Microsecond
	}
}

// List returns up to limit held locks (at most maxPage) whose names start with prefix, in
// name (byte) order, after the name cursor (sql/list.sql); next is the last name of the page
// when more follow, "" at the end. A kept lock (a MinHold window) is listed as held. It
// returns the driver's error.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = min(max(limit, 1), maxPage)
	var rows pgx.Rows
	var err error
	if upper, ok := successor(prefix); ok {
		rows, err = s.pool.Query(ctx, s.sql.list, prefix, upper, cursor, limit+1)
	} else {
		rows, err = s.pool.Query(ctx, s.sql.listAll, prefix, cursor, limit+1)
	}
	if err != nil {
		return nil, "", err
	}
	var (
		page      []guard.LockInfo
		info      guard.LockInfo
		remaining int64
	)
	_, err = pgx.ForEachRow(rows,
		[]any{&info.Name, &info.Kept, &info.Fence, &info.Instance, &info.Label, &info.AcquiredAt, &remaining},
		func() error {
			info.Held = true
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
	return page, page[limit-1].Name, nil
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

// ForceRelease frees name whoever holds it or keeps it, keeping its fence, and notifies
// listeners in the same statement (sql/force_release.sql). The notice carries no token: no
// Guard released the lock, so every Guard waiting for it is to be woken. It returns
// guard.ErrNotHeld when name is free, or the driver's error.
func (s *Store) ForceRelease(ctx context.Context, name string) error {
	tag, err := s.pool.Exec(ctx, s.sql.forceRelease, name, s.channel, payload(name, ""))
	switch {
	case err != nil:
		return err
	case tag.RowsAffected() == 0:
		return guard.ErrNotHeld
	}
	return nil
}

// Reclaim deletes the rows of names that have been free — released, or with a lease that ran
// out — for longer than idle by the database's clock, and returns how many it deleted: a
// service that locks one name per request keeps one row per name it ever locked until then.
// Run it now and then (daily, say) with idle of an hour or more. The next acquisition of a
// reclaimed name takes a fence from the database's clock, above the row's last one (see
// MinReclaimIdle). It returns ErrIdleTooShort when idle is under MinReclaimIdle, or the
// driver's error.
func (s *Store) Reclaim(ctx context.Context, idle time.Duration) (int64, error) {
	if idle < MinReclaimIdle {
		return 0, fmt.Errorf("%w: %v, less than %v", ErrIdleTooShort, idle, MinReclaimIdle)
	}
	tag, err := s.pool.Exec(ctx, s.sql.reclaim, micros(idle))
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
