package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/guardlock/guard"
)

// DefaultTable is the lock table of a Store unless WithTable names another.
const DefaultTable = "guard_locks"

// MinReclaimIdle is the shortest idle time Reclaim accepts. A deleted row takes its fence
// with it, and the next acquisition of the name starts from the database's clock in
// microseconds: that is above every fence the row gave as long as the clock has moved on (and
// not stepped back) by more than the row was ahead of it, which a minute covers many times
// over.
const MinReclaimIdle = time.Minute

// Sentinel errors. The errors of a Store wrap them, or return the driver's error, bare.
var (
	// ErrSubscriptionClosed reports a Watch on a closed Subscription.
	ErrSubscriptionClosed = errors.New("pgstore: subscription closed")
	// ErrIdleTooShort reports a Reclaim with an idle time under MinReclaimIdle.
	ErrIdleTooShort = errors.New("pgstore: reclaim idle time too short")
	// errLease reports a lease or keep time the Store cannot send: not positive.
	errLease = errors.New("pgstore: lease is not positive")
)

var (
	_ guard.Backend   = (*Store)(nil)
	_ guard.Notifier  = (*Store)(nil)
	_ guard.Inspector = (*Store)(nil)
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// Store is a guard.Backend, guard.Notifier and guard.Inspector on a PostgreSQL table. It is
// safe for concurrent use. It does not own its pool: close the pool after the Guards that use
// the Store are closed.
type Store struct {
	pool    *pgxpool.Pool
	table   string // the table as given (lower case), for messages
	channel string // the LISTEN/NOTIFY channel of the table
	sql     statements

	// Health checks and reconnection of a Subscription's connection (notify.go): fields so
	// that tests can shorten them.
	idleCheck, pongTimeout, connectTimeout time.Duration
}

// statements holds the Store's SQL, with its table name in place.
type statements struct {
	createTable, acquire, extend, release, forceRelease, inspect, list, listAll, reclaim string
}

// Option configures a Store. Pass options to New, which checks them.
type Option func(*config)

type config struct {
	table string
}

// WithTable sets the lock table: a plain identifier ("locks") or a schema-qualified one
// ("ops.locks"), each part letters, digits, '_' and '$', not starting with a digit or '$', at
// most 63 bytes. As in SQL without quotes, the name is folded to lower case. Anything else
// (quotes, spaces, a third part) makes New panic: configuration cannot inject SQL.
// Default: DefaultTable ("guard_locks"), in the first schema of the search_path.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// identifier is one unquoted SQL identifier part that WithTable accepts.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// New returns a Store that keeps locks in a table of the database that pool reaches. It does
// no I/O: create the table with CreateTable, or by hand (see docs/backends.md). It panics with
// a "guard/pgstore:" message when pool is nil or an option is invalid.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	if pool == nil {
		panic("guard/pgstore: New: nil pool")
	}
	c := config{table: DefaultTable}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	parts := strings.Split(c.table, ".")
	if len(parts) > 2 {
		panic(fmt.Sprintf("guard/pgstore: WithTable(%q): a table name or schema.table, nothing more", c.table))
	}
	for i, p := range parts {
		if !identifier.MatchString(p) {
			panic(fmt.Sprintf("guard/pgstore: WithTable(%q): %q is not a plain SQL identifier "+
				"(letters, digits, '_' and '$', not starting with a digit or '$', at most 63 bytes)", c.table, p))
		}
		parts[i] = strings.ToLower(p)
	}
	s := &Store{
		pool:           pool,
		table:          strings.Join(parts, "."),
		idleCheck:      idleCheck,
		pongTimeout:    pongTimeout,
		connectTimeout: connectTimeout,
	}
	s.channel = channelOf(s.table)
	quoted := pgx.Identifier(parts).Sanitize()
	load := func(file string) string {
		b, err := sqlFiles.ReadFile("sql/" + file)
		if err != nil {
			panic("guard/pgstore: " + err.Error()) // embedded: cannot happen
		}
		return strings.ReplaceAll(stripComments(string(b)), "{{table}}", quoted)
	}
	s.sql = statements{
		createTable:  load("create_table.sql"),
		acquire:      load("acquire.sql"),
		extend:       load("extend.sql"),
		release:      load("release.sql"),
		forceRelease: load("force_release.sql"),
		inspect:      load("inspect.sql"),
		list:         load("list.sql"),
		listAll:      load("list_all.sql"),
		reclaim:      load("reclaim.sql"),
	}
	return s
}

// stripComments drops the comment lines of an embedded statement: they document the file,
// and need not travel with every request.
func stripComments(sql string) string {
	var b strings.Builder
	for line := range strings.Lines(sql) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	return strings.TrimSpace(b.String())
}

// Table returns the Store's lock table, as its statements name it (lower case).
func (s *Store) Table() string { return s.table }

// CreateTable creates the lock table if it does not exist (the schema must). It is safe to
// call from every instance at start-up, concurrently. It returns the driver's error.
func (s *Store) CreateTable(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, s.sql.createTable)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07" || pgErr.Code == "42710") {
		// Two sessions creating one table at once: the loser fails on a catalog's unique
		// index (the table's name, or its row type's) instead of finding the table. Now that
		// the winner has committed, the statement finds it; a real clash fails again.
		_, err = s.pool.Exec(ctx, s.sql.createTable)
	}
	return err
}

// micros returns d in whole microseconds, rounded up: the database keeps a lock at least as
// long as its owner was told.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Acquire makes one attempt to take r.Name for r.Token: one INSERT … ON CONFLICT DO UPDATE
// (sql/acquire.sql), judged by the database's clock. It returns the fence; a
// *guard.BusyError carrying the holder's remaining lease by the database's clock when
// another owner holds the name (Remaining 0 when the holder's grant is newer than the
// statement's snapshot); or the driver's error, which does not match guard.ErrNotAcquired.
// A transient failure is tried once more (see retry): Acquire is idempotent for its token.
func (s *Store) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if r.TTL <= 0 {
		return 0, fmt.Errorf("%w: %v", errLease, r.TTL)
	}
	var (
		granted   bool
		fence     int64
		remaining int64
	)
	err, _ := s.retry(ctx, func() error {
		return s.pool.QueryRow(ctx, s.sql.acquire,
			r.Name, r.Token, micros(r.TTL), r.Instance, r.Label).Scan(&granted, &fence, &remaining)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, &guard.BusyError{Name: r.Name}
	case err != nil:
		return 0, err
	case !granted:
		return 0, &guard.BusyError{Name: r.Name, Remaining: time.Duration(remaining) * time.Microsecond}
	}
	return uint64(fence), nil
}

// Extend sets the lease of each lock in leases that its token still holds, from the
// database's now(): one UPDATE … FROM unnest(…) for the whole batch (sql/extend.sql). It
// returns one error per lease, in order: nil when extended, guard.ErrNotHeld when the name is
// free, expired, held by another token or kept for a MinHold window, or the driver's error
// (the same one for every lease of the batch).
func (s *Store) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := make([]error, len(leases))
	if len(leases) == 0 {
		return errs
	}
	names := make([]string, 0, len(leases))
	tokens := make([]string, 0, len(leases))
	ttls := make([]int64, 0, len(leases))
	for i, l := range leases {
		if l.TTL <= 0 {
			errs[i] = fmt.Errorf("%w: %v", errLease, l.TTL)
			continue
		}
		names = append(names, l.Name)
		tokens = append(tokens, l.Token)
		ttls = append(ttls, micros(l.TTL))
	}
	if len(names) == 0 {
		return errs
	}
	type lease struct{ name, token string }
	extended := make(map[lease]bool, len(names))
	err, _ := s.retry(ctx, func() error {
		clear(extended)
		rows, err := s.pool.Query(ctx, s.sql.extend, names, tokens, ttls)
		if err != nil {
			return err
		}
		var l lease
		_, err = pgx.ForEachRow(rows, []any{&l.name, &l.token}, func() error {
			extended[l] = true
			return nil
		})
		return err
	})
	for i, l := range leases {
		switch {
		case errs[i] != nil:
		case err != nil:
			errs[i] = err
		case !extended[lease{l.Name, l.Token}]:
			errs[i] = guard.ErrNotHeld
		}
	}
	return errs
}

// Release gives name up if token holds it: one UPDATE whose statement also sends pg_notify
// on the table's channel (sql/release.sql). The row stays, with its fence. With keep > 0 the
// name stays taken for keep under no token. It returns guard.ErrNotHeld when token does not
// hold name, or the driver's error.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	var released int64
	err, first := s.retry(ctx, func() error {
		tag, err := s.pool.Exec(ctx, s.sql.release,
			name, token, micros(max(keep, 0)), s.channel, payload(name, token))
		released = tag.RowsAffected()
		return err
	})
	switch {
	case err != nil:
		return err
	case released == 0 && first != nil:
		// The first attempt may have released the lock before its connection failed, and
		// then the second finds it not held: report the failure, not "not held".
		return first
	case released == 0:
		return guard.ErrNotHeld
	}
	return nil
}

// payload is the notification of name's release by token: the token's length in bytes, ':',
// the token, then the name. A token too long for PostgreSQL's 8000-byte payload beside a name
// (names are at most guard.MaxNameLen bytes) is left out: the notice then has no token.
func payload(name, token string) string {
	if len(token)+len(name) > maxPayload-24 {
		token = ""
	}
	return strconv.Itoa(len(token)) + ":" + token + name
}

// maxPayload is PostgreSQL's limit on a notification's payload, in bytes (less than 8000).
const maxPayload = 7999

// parsePayload undoes payload.
func parsePayload(p string) (name, token string, ok bool) {
	n, rest, ok := strings.Cut(p, ":")
	if !ok {
		return "", "", false
	}
	k, err := strconv.Atoi(n)
	if err != nil || k < 0 || k > len(rest) {
		return "", "", false
	}
	return rest[k:], rest[:k], rest[k:] != ""
}

// retry runs op, and runs it once more when its error is transient and a second run is safe:
//
//   - the transaction was rolled back (serialization failure, deadlock);
//   - nothing reached the server (pgconn.SafeToRetry);
//   - the request went out and the connection failed (reset, server shutting down): op may
//     have run. Acquire and Extend are idempotent for their tokens; Release learns from
//     ambiguous whether its second run's "not held" may be the first run's doing.
//
// It does not retry when ctx is done, nor any other error: a constraint, a missing table, a
// syntax error are not transient. A request that times out is not retried either: the
// caller's deadline has passed, and the Guard's own deadline rules.
func (s *Store) retry(ctx context.Context, op func() error) (err error, ambiguous error) {
	err = op()
	if err == nil || ctx.Err() != nil {
		return err, nil
	}
	switch transience(err) {
	case rolledBack, notSent:
		return op(), nil
	case sentLost:
		return op(), err
	}
	return err, nil
}

// Kinds of errors, for retry.
const (
	permanent  = iota
	rolledBack // the server rolled the statement back: it had no effect
	notSent    // the request never reached the server
	sentLost   // the request may have run; the connection failed before its answer came
)

// transience classifies err.
func transience(err error) int {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40001", pgErr.Code == "40P01": // serialization failure, deadlock
			return rolledBack
		case pgErr.Code == "0A000":
			// "cached plan must not change result type": the table was altered under a
			// prepared statement. pgx has dropped its cache; the statement did not run.
			return rolledBack
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // shutdown
			return sentLost
		}
		return permanent
	}
	if pgconn.SafeToRetry(err) {
		return notSent
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return permanent
	}
	if pgconn.Timeout(err) {
		return permanent
	}
	return sentLost // the network: a reset, an EOF, a closed connection
}
