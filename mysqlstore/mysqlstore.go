package mysqlstore

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/guardlock/guard"
)

var (
	_ guard.Backend   = (*Store)(nil)
	_ guard.Inspector = (*Store)(nil)
	_ guard.Sharing   = (*Store)(nil)
	_ guard.Batcher   = (*Store)(nil)
)

// WaitMark is how long the mark of an exclusive request that waits lasts after its last
// request: while it does, no shared request is granted (procedures.go). A waiting Guard asks
// again at least every second, and each request renews the mark.
const WaitMark = 3 * time.Second

// DefaultTable is the table a Store keeps its locks in unless WithTable says otherwise.
const DefaultTable = "guard_locks"

// maxToken is the longest token, in bytes, that the token column holds.
const maxToken = 255

// Store keeps locks in a MySQL or MariaDB table — a row per lock name, per holder and per
// waiter — and its stored procedures. It is safe for concurrent use. Create it with New.
type Store struct {
	db *sql.DB

	// The statements of sql.go with {table} and the procedures' names filled in.
	acquire, acquireAll, extend, held, release, forceRelease, inspect, list, idle, reclaimDead, reclaim string
	createTable, columns, migrateColumns, migrateKept, migrateNames, migrateDone                        string

	table      string // the table, quoted
	schema     string // its schema as a literal, or DATABASE()
	tableName  string // its name as a literal
	procedures []procedure
}

// procedure is one stored procedure of the table, as CreateTable makes it.
type procedure struct {
	name   string // quoted, schema-qualified as the table is
	bare   string // its name as a literal, for information_schema
	digest string // of its definition, kept in its COMMENT
	create string
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

// splitTable checks a WithTable name and returns its parts.
func splitTable(name string) ([]string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, errors.New("more than one dot: use table or schema.table")
	}
	for _, p := range parts {
		if !identifier.MatchString(p) {
			return nil, errors.New("not a plain identifier: letters, digits and _, starting with a letter or _, at most 64")
		}
	}
	return parts, nil
}

// quote returns parts quoted with backticks and joined with dots.
func quote(parts []string) string {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = "`" + p + "`"
	}
	return strings.Join(q, ".")
}

// procedureBase is what the names of a table's procedures start with: the table's name, or,
// when that leaves no room for "$force_release" within MySQL's 64 characters, "guard$" and
// part of its MD5.
func procedureBase(table string) string {
	if len(table)+len("$force_release") <= 64 {
		return table
	}
	sum := md5.Sum([]byte(table))
	return "guard$" + hex.EncodeToString(sum[:])[:24]
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
	parts, err := splitTable(c.table)
	if err != nil {
		panic(fmt.Sprintf("guard/mysqlstore: WithTable(%q): %v", c.table, err))
	}
	table := quote(parts)
	st := &Store{db: db, table: table, schema: "DATABASE()", tableName: "'" + parts[len(parts)-1] + "'"}
	if len(parts) == 2 {
		st.schema = "'" + parts[0] + "'"
	}
	base := procedureBase(parts[len(parts)-1])
	names := []string{"{table}", table}
	procName := func(op string) string {
		p := slices.Clone(parts)
		p[len(p)-1] = base + "$" + op
		return quote(p)
	}
	for _, p := range procedures {
		names = append(names, "{"+p.op+"}", procName(p.op))
	}
	t := strings.NewReplacer(names...).Replace
	// Inside a procedure, a name without a schema is the procedure's schema's, which is the
	// table's: the bodies name the table and the other procedures without one, so that stores
	// spelling the table differently (schema.table, or table in the DSN's database) make the
	// same procedures, and do not replace each other's.
	inner := []string{"{table}", quote(parts[len(parts)-1:])}
	for _, p := range procedures {
		inner = append(inner, "{"+p.op+"}", quote([]string{base + "$" + p.op}))
	}
	innerT := strings.NewReplacer(inner...).Replace
	for _, p := range procedures {
		body := p.body
		for slot, expr := range reqFields {
			body = strings.ReplaceAll(body, slot, expr)
		}
		def := "(" + p.params + ")\nMODIFIES SQL DATA" + innerT(body)
		sum := sha256.Sum256([]byte(def))
		digest := "guard " + hex.EncodeToString(sum[:8])
		st.procedures = append(st.procedures, procedure{
			name: procName(p.op), bare: "'" + base + "$" + p.op + "'", digest: digest,
			create: "CREATE PROCEDURE " + procName(p.op) + def[:strings.Index(def, "\nMODIFIES")] +
				"\nMODIFIES SQL DATA COMMENT '" + digest + "'" + def[strings.Index(def, "\nMODIFIES")+len("\nMODIFIES SQL DATA"):],
		})
	}
	st.acquire, st.acquireAll, st.release, st.forceRelease = t(acquireSQL), t(acquireAllSQL), t(releaseSQL), t(forceReleaseSQL)
	st.extend, st.held, st.inspect, st.list = t(extendSQL), t(heldSQL), t(inspectSQL), t(listSQL)
	st.idle, st.reclaimDead, st.reclaim = t(idleSQL), t(reclaimDeadSQL), t(reclaimSQL)
	st.createTable, st.migrateColumns, st.migrateKept = t(createTableSQL), t(migrateColumnsSQL), t(migrateKeptSQL)
	st.migrateNames, st.migrateDone = t(migrateNamesSQL), t(migrateDoneSQL)
	st.columns = fill(columnsSQL, "{schema}", st.schema, "{name}", st.tableName)
	return st
}

// CreateTable creates the Store's table if it does not exist, migrates a table of the
// previous layout (one row per name) to the current one, and creates the table's stored
// procedures, or replaces those of another version (procedures.go); calling it again changes
// nothing. Instances may call it concurrently at start-up: it holds an advisory lock
// (GET_LOCK) on the table's name meanwhile. The user needs CREATE, ALTER, CREATE ROUTINE and
// ALTER ROUTINE. Teams that migrate by hand run the DDL printed in docs/backends.md instead.
//
// Every statement of a previous version fails on a migrated table (its column owner is now
// token): its instances acquire nothing — never a second owner — and the locks they hold end
// with their leases. Upgrade every instance (see docs/backends.md).
func (s *Store) CreateTable(ctx context.Context) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	key := "CONCAT('guard:', " + s.schema + ", '.', " + s.tableName + ")"
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+key+", 60)").Scan(&got); err != nil {
		return err
	}
	if got.Int64 != 1 {
		return errors.New("mysqlstore: CreateTable: another instance held the set-up lock for a minute")
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK("+key+")")
	}()
	if _, err := conn.ExecContext(ctx, s.createTable); err != nil {
		return err
	}
	if err := s.migrate(ctx, conn); err != nil {
		return err
	}
	for _, p := range s.procedures {
		var comment string
		err := conn.QueryRowContext(ctx, "SELECT ROUTINE_COMMENT FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = "+
			s.schema+" AND ROUTINE_NAME = "+p.bare+" AND ROUTINE_TYPE = 'PROCEDURE'").Scan(&comment)
		switch {
		case err == nil && comment == p.digest:
			continue
		case err != nil && !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if _, err := conn.ExecContext(ctx, "DROP PROCEDURE IF EXISTS "+p.name); err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, p.create); err != nil {
			return err
		}
	}
	return nil
}

// migrate brings a table of the previous layout to the current one (sql.go, migrateSQL).
func (s *Store) migrate(ctx context.Context, conn *sql.Conn) error {
	has := make(map[string]bool)
	rows, err := conn.QueryContext(ctx, s.columns)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return err
		}
		has[strings.ToLower(c)] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	if has["waiting"] {
		return nil
	}
	if !has["kept"] {
		if _, err := conn.ExecContext(ctx, s.migrateColumns); err != nil {
			return err
		}
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, q := range []string{s.migrateKept, s.migrateNames} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, s.migrateDone)
	return err
}

// SharedLocks tells that a Store grants shared holds (guard.Sharing).
func (*Store) SharedLocks() {}

// errToken reports a token that no lock can hold.
var errToken = errors.New("mysqlstore: the token must be 1 to 255 bytes")

func validToken(token string) bool { return token != "" && len(token) <= maxToken }

// Acquire makes one attempt to take r.Name for r.Token: one CALL of the table's acquire
// procedure (procedures.go), judged by the database's clock. A retry by the token that holds
// the name (its reply was lost) sets the lease again and keeps the fence. A shared request
// (r.Shared) is granted beside other shared holders, up to r.Limit of them (any number for
// 0), unless an exclusive request waits: a busy exclusive request with r.Wait marks its wait
// for WaitMark, renewed by each of its requests, so that readers and permits do not starve
// it. The Store keeps no queue beyond that (MySQL cannot wake a waiter in another process,
// see procedures.go): BusyError.Queued stays 0, and after a release whoever asks first gets
// the name. It returns the fence, or a *guard.BusyError with how long the name stays
// unavailable to r by the database's clock.
//
// A deadlock, a lock wait timeout or a connection lost mid-statement is retried once: the
// call is idempotent for its token. Other errors are the driver's, never busy; an invalid
// name is a *guard.NameError.
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
		"{instance}", text(r.Instance), "{label}", text(r.Label), "{value}", text(r.Value),
		"{shared}", boolean(r.Shared), "{limit}", strconv.Itoa(min(max(r.Limit, 0), math.MaxInt32)),
		"{wait}", boolean(r.Wait), "{place}", micros(WaitMark))
	var (
		granted   bool
		fence     uint64
		remaining int64
	)
	if err := s.call(ctx, q, true, &granted, &fence, &remaining); err != nil {
		return 0, err
	}
	if !granted {
		return 0, &guard.BusyError{Name: r.Name, Remaining: time.Duration(remaining) * time.Microsecond}
	}
	return fence, nil
}

// AcquireAll makes one attempt to take every request's name, all or none: one CALL of the
// table's acquire_all procedure, one transaction that locks the names' rows in byte order
// and grants them only when each fits as Acquire's would. It queues nobody. It returns the
// fences in order, a *guard.BusyError for the first name (in byte order) that does not fit,
// or the driver's error (after which it holds none of the names).
func (s *Store) AcquireAll(ctx context.Context, reqs []guard.Request) ([]uint64, error) {
	order := make([]int, len(reqs))
	for i, r := range reqs {
		if err := guard.CheckName(r.Name); err != nil {
			return nil, err
		}
		if !validToken(r.Token) {
			return nil, errToken
		}
		if r.TTL < time.Microsecond {
			return nil, fmt.Errorf("mysqlstore: lease %v is shorter than a microsecond", r.TTL)
		}
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(reqs[a].Name, reqs[b].Name) })
	var js strings.Builder
	js.WriteByte('[')
	for k, i := range order {
		r := reqs[i]
		if k > 0 {
			js.WriteByte(',')
		}
		fmt.Fprintf(&js, `{"n":"%x","t":"%x","i":"%x","b":"%x","v":"%x","l":%s,"s":%s,"m":%d}`,
			r.Name, r.Token, textBytes(r.Instance), textBytes(r.Label), textBytes(r.Value), micros(r.TTL),
			boolean(r.Shared), min(max(r.Limit, 0), math.MaxInt32))
	}
	js.WriteByte(']')
	var (
		fences    string
		busy      int
		remaining int64
	)
	if err := s.call(ctx, fill(s.acquireAll, "{reqs}", js.String()), true, &fences, &busy, &remaining); err != nil {
		return nil, err
	}
	if busy > 0 && busy <= len(order) {
		return nil, &guard.BusyError{Name: reqs[order[busy-1]].Name, Remaining: time.Duration(remaining) * time.Microsecond}
	}
	got := strings.Split(fences, ",")
	if len(got) != len(reqs) {
		return nil, fmt.Errorf("mysqlstore: acquire_all returned %d fences for %d names", len(got), len(reqs))
	}
	out := make([]uint64, len(reqs))
	for k, f := range got {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("mysqlstore: acquire_all returned fence %q", f)
		}
		out[order[k]] = v
	}
	return out, nil
}

// call runs the CALL q, which answers one row, into dest, and runs it once more after an
// error that undid it (see exec).
func (s *Store) call(ctx context.Context, q string, idempotent bool, dest ...any) error {
	err := s.db.QueryRowContext(ctx, q).Scan(dest...)
	if err != nil && ctx.Err() == nil && (rolledBack(err) || idempotent && connectionLost(err)) {
		err = s.db.QueryRowContext(ctx, q).Scan(dest...)
	}
	return err
}

// boolean returns b as SQL.
func boolean(b bool) string {
	if b {
		return "1"
	}
	return "0"
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
	// The last lease of a lock named twice stands (guard.Backend.Extend): the statement names
	// each lock once, with that lease's TTL, and counts its row once.
	last := make(map[[2]string]time.Duration, len(leases))
	for _, l := range leases {
		last[[2]string{l.Name, l.Token}] = l.TTL
	}
	var pairs, ttls strings.Builder
	sameTTL, live := true, 0
	for i, l := range leases {
		if !validToken(l.Token) || guard.CheckName(l.Name) != nil {
			errs[i] = guard.ErrNotHeld // no row can hold it
			continue
		}
		ttl, ok := last[[2]string{l.Name, l.Token}]
		if !ok {
			continue // named already
		}
		delete(last, [2]string{l.Name, l.Token})
		if live > 0 {
			pairs.WriteString(", ")
		}
		live++
		fmt.Fprintf(&pairs, "(%s, %s)", bin(l.Name), bin(l.Token))
		fmt.Fprintf(&ttls, " WHEN name = %s AND token = %s THEN %s", bin(l.Name), bin(l.Token), micros(ttl))
		sameTTL = sameTTL && ttl == leases[len(leases)-1].TTL
	}
	if live == 0 {
		return
	}
	ttl := micros(leases[len(leases)-1].TTL)
	if !sameTTL {
		ttl = "CASE" + ttls.String() + " END"
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

// whichHeld reads which leases of a partly extended batch are still live holds, and sets
// ErrNotHeld for the others.
func (s *Store) whichHeld(ctx context.Context, leases []guard.Lease, errs []error) {
	var pairs strings.Builder
	for i, l := range leases {
		if errs[i] == nil {
			if pairs.Len() > 0 {
				pairs.WriteString(", ")
			}
			fmt.Fprintf(&pairs, "(%s, %s)", bin(l.Name), bin(l.Token))
		}
	}
	type hold struct{ name, token string }
	live := make(map[hold]bool)
	err := s.query(ctx, fill(s.held, "{pairs}", pairs.String()), func(rows *sql.Rows) error {
		var name, token []byte
		if err := rows.Scan(&name, &token); err != nil {
			return err
		}
		live[hold{string(name), string(token)}] = true
		return nil
	})
	if err != nil {
		setUnset(errs, err)
		return
	}
	for i, l := range leases {
		if errs[i] == nil && !live[hold{l.Name, l.Token}] {
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

// Release gives name up if token holds it: one CALL of the table's release procedure. With keep > 0 the hold stays for keep
// more, by the database's clock, under no owner (a MinHold window), so that no renewal of
// token can shorten the window. A token that waits for name takes its wait mark away, and
// Release returns guard.ErrNotHeld. It returns guard.ErrNotHeld when token does not hold name (its
// lease ended, or another token holds it), or the driver's error. A deadlock or a lock wait
// timeout is retried once; a connection lost mid-statement is not, because the release may
// have been done and a retry would answer ErrNotHeld.
//
// MySQL has no notifications: waiters in other processes learn of the release when they next
// ask (see docs/backends.md).
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if !validToken(token) || guard.CheckName(name) != nil {
		return guard.ErrNotHeld
	}
	q := fill(s.release, "{name}", bin(name), "{token}", bin(token), "{keep}", micros(max(keep, 0)))
	var done int
	if err := s.call(ctx, q, false, &done); err != nil {
		return err
	}
	if done != 1 {
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
