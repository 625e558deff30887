package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/guardlock/guard"
)

// Inspect returns what the table says of name: its holder while it is held, and the last
// holder's fence, instance, label and grant time once it is free. A name without a row (never
// taken, or reclaimed) is free with Fence 0.
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	info := guard.LockInfo{Name: name}
	found := false
	err := s.query(ctx, fill(s.inspect, "{name}", bin(name)), func(rows *sql.Rows) error {
		found = true
		return scanInfo(rows, &info)
	})
	if err != nil || !found {
		return guard.LockInfo{Name: name}, err
	}
	return info, nil
}

// scanInfo reads infoColumns into info, after the columns already in dest.
func scanInfo(rows *sql.Rows, info *guard.LockInfo, dest ...any) error {
	var (
		noOwner          bool
		acquired, remain int64
	)
	dest = append(dest, &noOwner, &info.Fence, &info.Instance, &info.Label, &acquired, &remain)
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	info.AcquiredAt = time.UnixMicro(acquired)
	info.Held = remain > 0
	if info.Held {
		info.Kept = noOwner
		info.Remaining = time.Duration(remain) * time.Microsecond
	}
	return nil
}

// maxList is the most locks one List page returns.
const maxList = 10000

// List returns the held locks whose names start with prefix, in name order (byte by byte),
// after the name cursor, at most limit of them (1 to 10000), and the last name of the page as
// the next cursor when more follow. It reads a range of the primary key, so a prefix's
// wildcards mean nothing.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = min(max(limit, 1), maxList)
	q := fill(s.list, "{from}", bin(prefix), "{to}", bin(prefixEnd(prefix)), "{cursor}", bin(cursor),
		"{limit}", strconv.Itoa(limit+1))
	var page []guard.LockInfo
	err := s.query(ctx, q, func(rows *sql.Rows) error {
		var (
			name []byte
			info guard.LockInfo
		)
		if err := scanInfo(rows, &info, &name); err != nil {
			return err
		}
		info.Name = string(name)
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

// ForceRelease frees name whoever holds it — a holder or a MinHold window — keeping its fence:
// the holder's next renewal finds its token gone. It returns guard.ErrNotHeld when name is
// free, or the driver's error.
func (s *Store) ForceRelease(ctx context.Context, name string) error {
	return s.changeOne(ctx, fill(s.forceRelease, "{name}", bin(name)))
}

// MinReclaimIdle is the shortest idle time Reclaim accepts.
const MinReclaimIdle = time.Minute

// ErrIdleTooShort reports a Reclaim with an idle time under MinReclaimIdle.
var ErrIdleTooShort = errors.New("mysqlstore: reclaim idle time too short")

// reclaimBatch is how many rows Reclaim deletes per statement.
const reclaimBatch = 200

// Reclaim deletes the rows of names that have been free for longer than idle by the
// database's clock — released, or their lease ended — and returns how many it deleted. A
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
		res, err := s.exec(ctx, fill(s.reclaim, "{names}", strings.Join(lits, ", "), "{idle}", micros(idle)), true)
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
