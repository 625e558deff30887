package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/guardlock/guard"
)

var (
	_ guard.Backend   = (*Store)(nil)
	_ guard.Inspector = (*Store)(nil)
)

// DefaultTable is the table a Store keeps its locks in unless WithTable says otherwise.
const DefaultTable = "guard_locks"

// maxToken is the longest token, in bytes, that the owner column holds.
const maxToken = 255

// Store keeps locks in a MySQL or MariaDB table, one row per lock name. It is safe for
// concurrent use. Create it with New.
type Store struct {
	db *sql.DB

	// The statements of sql.go with {table} filled in.
	acquire, extend, held, release, forceRelease, inspect, list, idle, reclaim, createTable string
}

// Option configures a Store. Pass options to New, which checks them.
type Option func(*config)

type config struct {
	table string
}

// WithTable sets the table that keeps the locks: a plain identifier ("locks") or one
// qualified by its schema ("app.locks"), each part letters, digits and underscores, starting
// with a letter or an underscore, at most 64 characters. New panics on anything else, so that
// configuration can never inject SQL. Default: DefaultTable ("guard_locks") in the DSN's
// database.
func WithTable(name string) Option {
	return func(c *config) { c.table = name }
}

// identifier is a plain MySQL identifier, as WithTable accepts it.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// quoteTable checks a WithTable name and returns it quoted with backticks.
func quoteTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", errors.New("more than one dot: use table or schema.table")
	}
	for i, p := range parts {
		if !identifier.MatchString(p) {
			return "", errors.New("not a plain identifier: letters, digits and _, starting with a letter or _, at most 64")
		}
		parts[i] = "`" + p + "`"
	}
	return strings.Join(parts, "."), nil
}

// New returns a Store that keeps its locks in a table of db (see CreateTable). It does no
// I/O. New panics on a nil db or an invalid option.
//
// db must run its statements in autocommit mode, the default: each operation of the Store is
// one statement that commits on its own. Any go-sql-driver DSN works otherwise — the Store
// depends on none of parseTime, loc, time_zone, interpolateParams, clientFoundRows or the
// sql_mode.
func New(db *sql.DB, opts ...Option) *Store {
	if db == nil {
		panic("guard/mysqlstore: New with a nil *sql.DB")
	}
	c := config{table: DefaultTable}
	for _, o := range opts {
		if o == nil {
			panic("guard/mysqlstore: New with a nil Option")
		}
		o(&c)
	}
	table, err := quoteTable(c.table)
	if err != nil {
		panic(fmt.Sprintf("guard/mysqlstore: WithTable(%q): %v", c.table, err))
	}
	t := func(q string) string { return strings.ReplaceAll(q, "{table}", table) }
	return &Store{
		db: db, acquire: t(acquireSQL), extend: t(extendSQL), held: t(heldSQL), release: t(releaseSQL),
		forceRelease: t(forceReleaseSQL), inspect: t(inspectSQL), list: t(listSQL),
		idle: t(idleSQL), reclaim: t(reclaimSQL), createTable: t(createTableSQL),
	}
}

// CreateTable creates the Store's table if it does not exist (CREATE TABLE IF NOT EXISTS);
// calling it again changes nothing. Teams that migrate by hand run the DDL printed in
// docs/backends.md instead.
func (s *Store) CreateTable(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, s.createTable)
	return err
}

// errToken reports a token that no lock can hold.
var errToken = errors.New("mysqlstore: the token must be 1 to 255 bytes")

func validToken(token string) bool { return token != "" && len(token) <= maxToken }

// Acquire takes r.Name for r.Token when its row is free, its lease ended by the database's
// clock, or r.Token holds it already (a retry of an attempt whose reply was lost: the lease is
// set again and the fence stays), in one INSERT … ON DUPLICATE KEY UPDATE. It returns the
// fence, or a *guard.BusyError with the holder's remaining lease — or what is left of a
// MinHold window — by the database's clock.
//
// A deadlock, a lock wait timeout or a connection lost mid-statement is retried once: the
// statement is idempotent for its token. Other errors are the driver's, never busy; an
// invalid name is a *guard.NameError.
func (s *Store) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if err := guard.CheckName(r.Name); err != nil {
		return 0, err
	}
	if !validToken(r.Token) {
		return 0, errToken
	}
	if r.TTL < time.Microsecond {
		return 0, fmt.Errorf("mysqlstore: lease %v is shorter than a microsecond", r.TTL)
	}
	q := fill(s.acquire,
		"{name}", bin(r.Name), "{token}", bin(r.Token), "{ttl}", micros(r.TTL),
		"{instance}", text(r.Instance), "{label}", text(r.Label))
	res, err := s.exec(ctx, q, true)
	if err != nil {
		return 0, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	fence, remaining, busy := decodeAcquire(id)
	if busy {
		return 0, &guard.BusyError{Name: r.Name, Remaining: remaining}
	}
	return fence, nil
}

// Extend sets the lease of each lock in leases that its token still holds to its TTL from
// now, by the database's clock, in one UPDATE for the batch (one per 1000 leases). When the
// UPDATE changed every row, or none, that is the whole answer; when it changed some, one
// SELECT of the batch's names tells which — a lease counts as extended when its name is
// still held by its token.
//
// Each error is nil, guard.ErrNotHeld, or the driver's error. A deadlock, a lock wait timeout
// or a connection lost mid-statement is retried once: extending again is harmless.
func (s *Store) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := make([]error, len(leases))
	for start := 0; start < len(leases); start += maxBatch {
		end := min(start+maxBatch, len(leases))
		s.extendBatch(ctx, leases[start:end], errs[start:end])
	}
	return errs
}

// maxBatch is the most leases one Extend statement carries, which keeps the statement (two
// hex literals per lease) well under max_allowed_packet and the optimizer's range memory.
const maxBatch = 1000

// extendBatch extends leases with one statement and sets errs, of the same length.
func (s *Store) extendBatch(ctx context.Context, leases []guard.Lease, errs []error) {
	var pairs, ttls strings.Builder
	sameTTL, live := true, 0
	for i, l := range leases {
		if !validToken(l.Token) || guard.CheckName(l.Name) != nil {
			errs[i] = guard.ErrNotHeld // no row can hold it
			continue
		}
		if live > 0 {
			pairs.WriteString(", ")
		}
		live++
		fmt.Fprintf(&pairs, "(%s, %s)", bin(l.Name), bin(l.Token))
		fmt.Fprintf(&ttls, " WHEN %s THEN %s", bin(l.Name), micros(l.TTL))
		sameTTL = sameTTL && l.TTL == leases[0].TTL
	}
	if live == 0 {
		return
	}
	ttl := micros(leases[0].TTL)
	if !sameTTL {
		ttl = "CASE name" + ttls.String() + " END"
	}
	res, err := s.exec(ctx, fill(s.extend, "{ttl}", ttl, "{pairs}", pairs.String()), true)
	var changed int64
	if err == nil {
		changed, err = res.RowsAffected()
	}
	switch {
	case err != nil:
		setUnset(errs, err)
	case changed == int64(live):
	case changed == 0:
		setUnset(errs, guard.ErrNotHeld)
	default:
		s.whichHeld(ctx, leases, errs)
	}
}

// whichHeld reads which leases of a partly extended batch still hold their names, and sets
// ErrNotHeld for the others.
func (s *Store) whichHeld(ctx context.Context, leases []guard.Lease, errs []error) {
	var names strings.Builder
	for i, l := range leases {
		if errs[i] == nil {
			if names.Len() > 0 {
				names.WriteString(", ")
			}
			names.WriteString(bin(l.Name))
		}
	}
	owners := make(map[string]string)
	err := s.query(ctx, fill(s.held, "{names}", names.String()), func(rows *sql.Rows) error {
		var name, owner []byte
		if err := rows.Scan(&name, &owner); err != nil {
			return err
		}
		owners[string(name)] = string(owner)
		return nil
	})
	if err != nil {
		setUnset(errs, err)
		return
	}
	for i, l := range leases {
		if errs[i] == nil && owners[l.Name] != l.Token {
			errs[i] = guard.ErrNotHeld
		}
	}
}

// setUnset sets every nil error of errs to err.
func setUnset(errs []error, err error) {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
}

// Release gives name up if token holds it: the row stays, with its fence, and no owner. With
// keep > 0 the name stays taken for keep more, by the database's clock, under no owner, so
// that no renewal of token can shorten the window. It returns guard.ErrNotHeld when token
// does not hold name (its lease ended, or another token holds it), or the driver's error.
// A deadlock or a lock wait timeout is retried once; a connection lost mid-statement is not,
// because the release may have been done and a retry would answer ErrNotHeld.
//
// MySQL has no notifications: waiters in other processes learn of the release when they
// next try (see docs/backends.md).
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if !validToken(token) || guard.CheckName(name) != nil {
		return guard.ErrNotHeld
	}
	q := fill(s.release, "{name}", bin(name), "{token}", bin(token), "{keep}", micros(max(keep, 0)))
	return s.changeOne(ctx, q)
}

// changeOne runs an UPDATE of one row: nil when it changed the row, guard.ErrNotHeld when it
// changed none.
func (s *Store) changeOne(ctx context.Context, q string) error {
	res, err := s.exec(ctx, q, false)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return err
	case n == 0:
		return guard.ErrNotHeld
	}
	return nil
}

// exec runs the statement q, and runs it once more after an error that undid it: a deadlock
// (1213) or a lock wait timeout (1205) — and, when idempotent, a connection lost while it was
// out, which may or may not have run it. (database/sql itself retries a statement on
// driver.ErrBadConn, which go-sql-driver returns only when nothing was sent.)
func (s *Store) exec(ctx context.Context, q string, idempotent bool) (sql.Result, error) {
	res, err := s.db.ExecContext(ctx, q)
	if err != nil && ctx.Err() == nil && (rolledBack(err) || idempotent && connectionLost(err)) {
		res, err = s.db.ExecContext(ctx, q)
	}
	return res, err
}

// query runs the SELECT q and calls scan for each row.
func (s *Store) query(ctx context.Context, q string, scan func(*sql.Rows) error) error {
	rows, err := s.db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// MySQL error numbers of statements that the server undid.
const (
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
)

// rolledBack reports an error after which the statement has had no effect.
func rolledBack(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == erLockDeadlock || me.Number == erLockWaitTimeout)
}

// connectionLost reports a connection that broke while a statement was out: it may or may not
// have run.
func connectionLost(err error) bool {
	return errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn)
}
