package pgstore

import (
	"context"
	"crypto/md5"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/display"
	"github.com/guardlock/guard/watchdog"
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
	_ guard.Sharing   = (*Store)(nil)
	_ guard.Batcher   = (*Store)(nil)
)

// QueueTimeout is how long a waiter keeps its place in a name's queue after its last request,
// at most: never longer than the lease it asked for (watchdog.Place).
const QueueTimeout = 5 * time.Second

//go:embed sql/*.sql
var sqlFiles embed.FS

// Store is a guard.Backend, guard.Notifier, guard.Inspector, guard.Sharing and guard.Batcher
// on a PostgreSQL table and its functions. It is safe for concurrent use. It does not own its pool: close the pool after the Guards that use
// the Store are closed.
type Store struct {
	pool  *pgxpool.Pool
	table string // the table as WithTable names it, for messages (see Table)
	sql   statements

	// Health checks and reconnection of a Subscription's connection (notify.go): fields so
	// that tests can shorten them.
	idleCheck, pongTimeout, connectTimeout time.Duration
}

// statements holds the Store's SQL, with its table name in place.
type statements struct {
	createTable, migrate, acquire, acquireAll, extend, release, forceRelease, inspect, list, listAll, reclaim string

	functions string // sql/functions.sql, filled in by CreateTable (functionsFor)
	setupLock string // the advisory lock CreateTable takes
	regclass  string // the table as a regclass literal

	channel string // selects the table's notification channel (sql/channel.sql)
}

// Option configures a Store. Pass options to New, which checks them.
type Option func(*config)

type config struct {
	table string
}

// WithTable sets the lock table: a name ("locks") or a schema-qualified one ("ops.locks").
// Each part is a plain SQL identifier — letters, digits, '_' and '$', not starting with a
// digit or '$' — which, as in SQL without quotes, is folded to lower case; or a
// double-quoted identifier, kept as written, with "" for a quote inside it ("Locks" or
// ops."Job locks"). A part is at most 63 bytes. Anything else (a space or a quote outside
// quotes, a third part, a NUL byte) makes New panic: configuration cannot inject SQL.
// Default: DefaultTable ("guard_locks"), in the first schema of the search_path.
//
// Stores that name one table differently — "ops.locks" here, "locks" with ops on the
// search_path there — share it, and its notification channel (see Subscribe).
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// identifier is one unquoted SQL identifier part that WithTable accepts.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// maxIdentifier is PostgreSQL's limit on an identifier, in bytes (NAMEDATALEN - 1).
const maxIdentifier = 63

// parseTable splits a WithTable name into its parts as the catalog names them: plain parts
// folded to lower case, quoted ones unquoted.
func parseTable(name string) ([]string, error) {
	var parts []string
	for rest := name; ; {
		var part string
		if strings.HasPrefix(rest, `"`) {
			var b strings.Builder
			i := 1
			for {
				j := strings.IndexByte(rest[i:], '"')
				if j < 0 {
					return nil, errors.New("a quoted part has no closing quote")
				}
				b.WriteString(rest[i : i+j])
				i += j + 1
				if !strings.HasPrefix(rest[i:], `"`) {
					break
				}
				b.WriteByte('"') // "" inside quotes
				i++
			}
			part, rest = b.String(), rest[i:]
			if part == "" || len(part) > maxIdentifier || strings.IndexByte(part, 0) >= 0 {
				return nil, fmt.Errorf("quoted part %q: 1 to %d bytes, no NUL", part, maxIdentifier)
			}
		} else {
			end := strings.IndexByte(rest, '.')
			if end < 0 {
				end = len(rest)
			}
			part, rest = rest[:end], rest[end:]
			if !identifier.MatchString(part) {
				return nil, fmt.Errorf("%q is not a plain SQL identifier (letters, digits, '_' and '$', "+
					"not starting with a digit or '$', at most 63 bytes) nor a quoted one", part)
			}
			part = strings.ToLower(part)
		}
		parts = append(parts, part)
		if rest == "" {
			break
		}
		if !strings.HasPrefix(rest, ".") || len(parts) == 2 {
			return nil, errors.New("a table name or schema.table, nothing more")
		}
		rest = rest[1:]
	}
	return parts, nil
}

// sqlName returns parts as SQL names them: each part as it is when it needs no quotes, quoted
// otherwise.
func sqlName(parts []string) string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p
		if !identifier.MatchString(p) || strings.ToLower(p) != p {
			out[i] = pgx.Identifier{p}.Sanitize()
		}
	}
	return strings.Join(out, ".")
}

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
	parts, err := parseTable(c.table)
	if err != nil {
		panic(fmt.Sprintf("guard/pgstore: WithTable(%q): %v", c.table, err))
	}
	s := &Store{
		pool:           pool,
		table:          sqlName(parts),
		idleCheck:      idleCheck,
		pongTimeout:    pongTimeout,
		connectTimeout: connectTimeout,
	}
	quoted := pgx.Identifier(parts).Sanitize()
	load := func(file string) string {
		b, err := sqlFiles.ReadFile("sql/" + file)
		if err != nil {
			panic("guard/pgstore: " + err.Error()) // embedded: cannot happen
		}
		return stripComments(string(b))
	}
	// The table as a regclass literal: the quoted name in a string, its quotes doubled.
	regclass := "'" + strings.ReplaceAll(quoted, "'", "''") + "'::regclass"
	channel := strings.ReplaceAll(load("channel.sql"), "{{regclass}}", regclass)
	fn := functionNames(parts)
	replace := []string{"{{table}}", quoted, "{{channel}}", channel, "{{regclass}}", regclass,
		"{{table_literal}}", "'" + strings.ReplaceAll(quoted, "'", "''") + "'"}
	for op, name := range fn {
		replace = append(replace, "{{"+op+"}}", name)
	}
	fill := func(file string) string { return strings.NewReplacer(replace...).Replace(load(file)) }
	s.sql = statements{
		createTable:  fill("create_table.sql"),
		migrate:      fill("migrate.sql"),
		acquire:      "SELECT * FROM " + fn["acquire"] + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
		acquireAll:   "SELECT * FROM " + fn["acquire_all"] + "($1, $2, $3, $4, $5, $6, $7, $8)",
		release:      "SELECT " + fn["release"] + "($1, $2, $3, $4)",
		forceRelease: "SELECT * FROM " + fn["force_release"] + "($1, $2, $3)",
		extend:       fill("extend.sql"),
		inspect:      fill("inspect.sql"),
		list:         fill("list.sql"),
		listAll:      fill("list_all.sql"),
		reclaim:      fill("reclaim.sql"),
		channel:      "SELECT " + channel,
		setupLock:    "SELECT pg_advisory_xact_lock(hashtext('guard:' || " + "'" + strings.ReplaceAll(quoted, "'", "''") + "'))",
		regclass:     regclass,
	}
	s.sql.functions = strings.ReplaceAll(load("functions.sql"), "{{channel}}", load("channel.sql"))
	return s
}

// resolveSQL returns the table as the catalog names it, schema-qualified, each part quoted
// where SQL needs quotes.
const resolveSQL = "SELECT n.nspname, c.relname FROM pg_catalog.pg_class AS c " +
	"JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = "

// functions returns the statements that create or replace the table's functions, for the
// table as the catalog names it (schema, name): each function in the table's schema, and
// every statement in it naming the table with its schema, so that every store on the table —
// however it spells it, whatever its search_path — runs the same functions on the same table.
func (st statements) functionsFor(schema, name string) []string {
	parts := []string{schema, name}
	quoted := pgx.Identifier(parts).Sanitize()
	replace := []string{"{{table}}", quoted, "{{regclass}}", "'" + strings.ReplaceAll(quoted, "'", "''") + "'::regclass"}
	for op, fn := range functionNames(parts) {
		replace = append(replace, "{{"+op+"}}", fn)
	}
	var out []string
	for stmt := range strings.SplitSeq(strings.NewReplacer(replace...).Replace(st.functions), "\n;;\n") {
		out = append(out, strings.TrimSpace(stmt))
	}
	return out
}

// functionOps are the table's functions (sql/functions.sql), by the name the SQL files give
// them.
var functionOps = []string{"lock", "check", "grant", "hand", "acquire", "acquire_all", "release", "force_release"}

// functionNames returns the SQL name of each of the table's functions, qualified as parts
// are: named after the table — "guard_locks$acquire" — or, when that is longer than an
// identifier may be, after the MD5 of its name ("guard$1b2c…$acquire"), so that the functions
// of two tables never clash. CreateTable creates them in the table's schema; a Store whose
// table name has no schema calls them through its search_path, as it finds the table.
func functionNames(parts []string) map[string]string {
	table := parts[len(parts)-1]
	base := table
	if len(base)+len("$force_release") > maxIdentifier {
		sum := md5.Sum([]byte(table))
		base = "guard$" + hex.EncodeToString(sum[:])[:24]
	}
	names := make(map[string]string, len(functionOps))
	for _, op := range functionOps {
		fn := slices.Clone(parts)
		fn[len(fn)-1] = base + "$" + op
		names[op] = pgx.Identifier(fn).Sanitize()
	}
	return names
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

// Table returns the Store's lock table as WithTable named it, in the form SQL reads it: plain
// parts folded to lower case, quoted parts quoted ("ops.locks", `ops."Locks"`).
func (s *Store) Table() string { return s.table }

// CreateTable creates the lock table if it does not exist (the schema must), migrates a table
// of the previous layout (one row per name) to the current one, and creates or replaces the
// table's functions (sql/functions.sql), in one transaction. It is safe to call from every
// instance at start-up, concurrently: the transaction takes an advisory lock on the table's
// name first. It returns the driver's error.
//
// A previous version's acquisitions and releases fail on a migrated table, with an error —
// never a second owner — and the locks its instances hold end with their leases at the
// latest: upgrade every instance at once (see docs/backends.md).
func (s *Store) CreateTable(ctx context.Context) error {
	var err error
	for range 3 {
		if err = s.createTable(ctx); !setupClash(err) {
			return err
		}
		// Two sessions creating one table or function at once (under two spellings of the
		// table, whose advisory locks differ): the loser fails on a catalog's unique index,
		// or on a concurrently updated catalog row. Now that the winner has committed, the
		// next try finds them.
	}
	return err
}

// createTable is one try of CreateTable.
func (s *Store) createTable(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, stmt := range []string{s.sql.setupLock, s.sql.createTable, s.sql.migrate} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		var schema, name string
		if err := tx.QueryRow(ctx, resolveSQL+s.sql.regclass).Scan(&schema, &name); err != nil {
			return err
		}
		for _, stmt := range s.sql.functionsFor(schema, name) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
}

// setupClash reports an error of CreateTable that another session's concurrent setup caused.
func setupClash(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07" || pgErr.Code == "42710" ||
		pgErr.Code == "XX000" || pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// SharedLocks tells that a Store grants shared holds (guard.Sharing).
func (*Store) SharedLocks() {}

// micros returns d in whole microseconds, rounded up: the database keeps a lock at least as
// long as its owner was told.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Acquire makes one attempt to take r.Name for r.Token: one call of the table's acquire
// function (sql/functions.sql), judged by the database's clock. r.Instance, r.Label and
// r.Value are stored as text (NUL bytes and invalid UTF-8 replaced by U+FFFD), which a text
// column always takes. A shared request (r.Shared) is granted beside other shared holders, up
// to r.Limit of them (any number for 0); every request is granted only when no live waiter
// queued before it. With r.Wait, a busy request queues r.Token (or refreshes its place) for
// QueueTimeout or r.TTL, whichever is shorter, and says so in BusyError.Queued. It returns the
// fence; a *guard.BusyError carrying how long the name stays unavailable to r by the
// database's clock; or the driver's error, which does not match guard.ErrNotAcquired. A
// transient failure is tried once more (see retry): Acquire is idempotent for its token.
func (s *Store) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if r.TTL <= 0 {
		return 0, fmt.Errorf("%w: %v", errLease, r.TTL)
	}
	var (
		granted                  bool
		fence, remaining, queued int64
	)
	err, _ := s.retry(ctx, func() error {
		return s.pool.QueryRow(ctx, s.sql.acquire,
			r.Name, r.Token, micros(r.TTL), display.Text(r.Instance), display.Text(r.Label), display.Text(r.Value),
			r.Shared, int32(min(max(r.Limit, 0), math.MaxInt32)), r.Wait, int32(min(max(r.Attempt, 0), math.MaxInt32)),
			micros(watchdog.Place(QueueTimeout, r.TTL))).Scan(&granted, &fence, &remaining, &queued)
	})
	switch {
	case err != nil:
		return 0, err
	case !granted:
		return 0, &guard.BusyError{Name: r.Name, Remaining: time.Duration(remaining) * time.Microsecond,
			Queued: time.Duration(queued) * time.Microsecond}
	}
	return uint64(fence), nil
}

// AcquireAll makes one attempt to take every request's name, all or none: one call of the
// table's acquire_all function, one transaction that locks the names' rows in byte order and
// grants them only when each fits as Acquire's would. It queues nobody. It returns the
// fences in order, a *guard.BusyError for the first name that does not fit, or the driver's
// error (after which it holds none of the names).
func (s *Store) AcquireAll(ctx context.Context, reqs []guard.Request) ([]uint64, error) {
	n := len(reqs)
	var (
		names, tokens, instances, labels, values = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		ttls                                     = make([]int64, n)
		shared                                   = make([]bool, n)
		limits                                   = make([]int32, n)
	)
	for i, r := range reqs {
		if r.TTL <= 0 {
			return nil, fmt.Errorf("%w: %v", errLease, r.TTL)
		}
		names[i], tokens[i], ttls[i] = r.Name, r.Token, micros(r.TTL)
		instances[i], labels[i], values[i] = display.Text(r.Instance), display.Text(r.Label), display.Text(r.Value)
		shared[i], limits[i] = r.Shared, int32(min(max(r.Limit, 0), math.MaxInt32))
	}
	var (
		fences    []int64
		busy      int32
		remaining int64
	)
	err, _ := s.retry(ctx, func() error {
		return s.pool.QueryRow(ctx, s.sql.acquireAll, names, tokens, ttls, instances, labels, values, shared, limits).
			Scan(&fences, &busy, &remaining)
	})
	switch {
	case err != nil:
		return nil, err
	case busy > 0 && int(busy) <= n:
		return nil, &guard.BusyError{Name: names[busy-1], Remaining: time.Duration(remaining) * time.Microsecond}
	case len(fences) != n:
		return nil, fmt.Errorf("pgstore: acquire_all returned %d fences for %d names", len(fences), n)
	}
	out := make([]uint64, n)
	for i, f := range fences {
		out[i] = uint64(f)
	}
	return out, nil
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
	// The last lease of a lock named twice stands (guard.Backend.Extend): each of them carries
	// its TTL, since an UPDATE … FROM that matches a row twice uses either.
	last := make(map[[2]string]time.Duration, len(leases))
	for _, l := range leases {
		if l.TTL > 0 {
			last[[2]string{l.Name, l.Token}] = l.TTL
		}
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
		ttls = append(ttls, micros(last[[2]string{l.Name, l.Token}]))
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

// Release gives name up if token holds it: one call of the table's release function, which
// hands what the release frees to the first waiters that fit (each told in a notification of
// its own) or, when it hands to nobody, notifies the table's channel; the notifications go out
// when the call commits (sql/functions.sql, sql/channel.sql). With keep > 0 the hold stays
// for keep under no token (a MinHold window), and the listeners are told. A token that waits
// for name leaves its queue, and Release returns guard.ErrNotHeld. It returns
// guard.ErrNotHeld when token does not hold name, or the driver's error.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	var released int32
	err, first := s.retry(ctx, func() error {
		return s.pool.QueryRow(ctx, s.sql.release, name, token, micros(max(keep, 0)), payload(name, token)).Scan(&released)
	})
	switch {
	case err != nil:
		return err
	case released == 0 && first != nil:
		// The first attempt may have released the lock before its connection failed, and
		// then the second finds it not held: report the failure, not "not held".
		return first
	case released != 1:
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

// parseNotice reads a notification of the table's channel: payload's, or one of a hand-over
// (sql/functions.sql, hand): '>', the fence, the lease in µs and the attempt, each followed by
// ':', then the waiter's token as payload writes a token, then payload's.
func parseNotice(p string) (guard.Notice, bool) {
	if rest, ok := strings.CutPrefix(p, ">"); ok {
		var nums [3]int64
		for i := range nums {
			n, tail, ok := strings.Cut(rest, ":")
			v, err := strconv.ParseInt(n, 10, 64)
			if !ok || err != nil || v < 0 {
				return guard.Notice{}, false
			}
			nums[i], rest = v, tail
		}
		next, rest, ok := cutToken(rest)
		if !ok || next == "" {
			return guard.Notice{}, false
		}
		name, token, ok := parsePayload(rest)
		if !ok || nums[2] > math.MaxInt32 {
			return guard.Notice{}, false
		}
		return guard.Notice{Name: name, Token: token, Next: next, Fence: uint64(nums[0]),
			Lease: time.Duration(nums[1]) * time.Microsecond, Attempt: int(nums[2])}, true
	}
	name, token, ok := parsePayload(p)
	return guard.Notice{Name: name, Token: token}, ok
}

// cutToken reads a token's length in bytes, ':', and the token, and returns the rest.
func cutToken(p string) (token, rest string, ok bool) {
	n, rest, ok := strings.Cut(p, ":")
	if !ok {
		return "", "", false
	}
	k, err := strconv.Atoi(n)
	if err != nil || k < 0 || k > len(rest) {
		return "", "", false
	}
	return rest[:k], rest[k:], true
}

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
