package mysqlstore

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/guardlock/guard/internal/display"
)

// The statements of the store, one per operation. Every one is a single statement sent with
// the text protocol, so each costs one round trip whatever the DSN says (server-side prepared
// statements, go-sql-driver's default for a query with arguments, would cost a second one for
// the PREPARE, or state per connection to keep them prepared).
//
// No value reaches the SQL text as written: strings go in as hexadecimal literals (X'…',
// made by bin and text), numbers as decimal digits. Those can mean nothing but the value
// under any character set, sql_mode or escaping rule, so no lock name, token or label can
// change a statement. {table} is the table name, checked and quoted by New.
//
// Time: every moment is read from the database's clock inside the statement, as
// UTC_TIMESTAMP(6), which MySQL and MariaDB fix at the start of the statement and which no
// session time_zone changes. Moments are stored as DATETIME(6) in UTC; DATETIME (unlike
// TIMESTAMP) is never converted by the session time zone either.
const (
	// createTableSQL is the schema; the DDL in docs/backends.md is a copy. Rows of a name,
	// all under the key (name, token):
	//   - the name's row, token '': the last number given — fences and places in the queue
	//     both count it up — and the last grant's time and metadata. Every change of the
	//     name's holders and queue locks this row first, so that they happen one at a time.
	//   - a holder's row, waiting 0: its token, fence, lease and metadata, shared or not;
	//     kept 1 once released for the rest of a MinHold window, which no token can extend
	//     or release and which counts as a holder.
	//   - a waiter's row, waiting 1: an exclusive request that waits, until when its mark
	//     lasts (expires_at); no shared request is granted while one is live (procedures.go).
	// A holder's or waiter's row whose expires_at is past is dead: the next change of the
	// name deletes it.
	createTableSQL = "CREATE TABLE IF NOT EXISTS {table} (\n" +
		"  name        VARBINARY(1024) NOT NULL COMMENT 'the lock name, compared byte by byte',\n" +
		"  token       VARBINARY(255)  NOT NULL COMMENT 'a holder''s or waiter''s token; empty for the name''s row',\n" +
		"  fence       BIGINT UNSIGNED NOT NULL COMMENT 'name''s row: the last number given; holder: its fence; waiter: its number',\n" +
		"  expires_at  DATETIME(6)     NOT NULL COMMENT 'end of the lease or wait (UTC, database clock); name''s row: of the longest given',\n" +
		"  acquired_at DATETIME(6)     NOT NULL COMMENT 'when the holder took it (UTC, database clock)',\n" +
		"  instance    VARCHAR(255)    NOT NULL COMMENT 'who took it (guard.WithInstance)',\n" +
		"  label       VARCHAR(255)    NOT NULL COMMENT 'the acquisition''s guard.Label',\n" +
		"  value       VARCHAR(255)    NOT NULL DEFAULT '' COMMENT 'what the holder publishes (an election''s value)',\n" +
		"  shared      BOOL            NOT NULL DEFAULT 0 COMMENT 'a shared hold (a permit, a reader)',\n" +
		"  kept        BOOL            NOT NULL DEFAULT 0 COMMENT 'released, kept for the rest of a MinHold window',\n" +
		"  waiting     BOOL            NOT NULL DEFAULT 0 COMMENT 'an exclusive request that waits, not a holder',\n" +
		"  PRIMARY KEY (name, token)\n" +
		") ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

	// columnsSQL reads which of the columns that tell the layout the table has: none of them
	// in a table of the previous layout (a row per name, primary key (name)); kept without
	// waiting in one whose migration stopped half-way.
	columnsSQL = "SELECT COLUMN_NAME FROM information_schema.COLUMNS\n" +
		"WHERE TABLE_SCHEMA = {schema} AND TABLE_NAME = {name} AND COLUMN_NAME IN ('kept', 'waiting')"

	// migrateSQL brings a table of the previous layout to the current one, in steps that
	// CreateTable runs in order, under an advisory lock: the columns — owner renamed token,
	// so that every statement of an earlier build fails on the new layout instead of taking
	// a name beside its holders — and the key; the rows —
	// each old row is the name's row (token ''), and a held one also stays its holder's row,
	// so that its holder renews and releases it as before, while a kept MinHold window gets a
	// token no caller has ('kept:' and its fence); the waiting column last, which marks the
	// migration done. The row steps can run again after a stop half-way: a name's row that
	// holders' rows share a name with is never taken for a kept window, and a name's row is
	// never made twice.
	migrateColumnsSQL = "ALTER TABLE {table}\n" +
		"  CHANGE COLUMN owner token VARBINARY(255) NOT NULL COMMENT 'a holder''s or waiter''s token; empty for the name''s row',\n" +
		"  ADD COLUMN value   VARCHAR(255) NOT NULL DEFAULT '' COMMENT 'what the holder publishes (an election''s value)',\n" +
		"  ADD COLUMN shared  BOOL         NOT NULL DEFAULT 0 COMMENT 'a shared hold (a permit, a reader)',\n" +
		"  ADD COLUMN kept    BOOL         NOT NULL DEFAULT 0 COMMENT 'released, kept for the rest of a MinHold window',\n" +
		"  DROP PRIMARY KEY, ADD PRIMARY KEY (name, token)"
	migrateKeptSQL = "UPDATE {table} AS k LEFT JOIN {table} AS h ON h.name = k.name AND h.token <> X''\n" +
		"SET k.token = CONCAT('kept:', k.fence), k.kept = 1\n" +
		"WHERE k.token = X'' AND k.expires_at > UTC_TIMESTAMP(6) AND h.name IS NULL"
	migrateNamesSQL = "INSERT IGNORE INTO {table} (name, token, fence, expires_at, acquired_at, instance, label)\n" +
		"SELECT name, X'', fence, expires_at, acquired_at, instance, label FROM {table} AS h WHERE h.token <> X''"
	migrateDoneSQL = "ALTER TABLE {table}\n" +
		"  ADD COLUMN waiting BOOL NOT NULL DEFAULT 0 COMMENT 'an exclusive request that waits, not a holder'"

	// extendSQL sets the lease of every (name, token) pair of the batch that still holds its
	// name; {ttl} is one number of microseconds, or, when the leases differ, a CASE on name
	// and token: a batch may hold a stale token of a name beside its live one, and the live
	// lock must get its own lease. Waiters and kept windows are left alone.
	// A row constructor IN list on the primary key is a range scan that locks only those
	// rows, in key order. The number of rows changed is the number of leases extended.
	extendSQL = "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL {ttl} MICROSECOND\n" +
		"WHERE (name, token) IN ({pairs}) AND token <> X'' AND NOT waiting AND NOT kept AND expires_at > UTC_TIMESTAMP(6)"

	// heldSQL reads which holds of a batch are live, when an Extend changed some of its rows
	// but not all.
	heldSQL = "SELECT name, token FROM {table}\n" +
		"WHERE (name, token) IN ({pairs}) AND token <> X'' AND NOT waiting AND NOT kept AND expires_at > UTC_TIMESTAMP(6)"

	// The operations that change a name's holders or queue are one CALL each of the
	// procedures below (procedures.go).
	acquireSQL      = "CALL {acquire}({name}, {token}, {ttl}, {instance}, {label}, {value}, {shared}, {limit}, {wait}, {place})"
	acquireAllSQL   = "CALL {acquire_all}('{reqs}')"
	releaseSQL      = "CALL {release}({name}, {token}, {keep})"
	forceReleaseSQL = "CALL {force_release}({name}, {fence})"

	// liveHolder selects the live holds of a name, of a row aliased c, for the name n.name.
	liveHolder = "c.token <> X'' AND NOT c.waiting AND c.expires_at > UTC_TIMESTAMP(6)"

	// inspectSQL reads the name's newest live holder (by fence), how many hold and wait for
	// it, and, for a free name, the last grant as the name's row keeps it. No row: a name
	// never taken, or reclaimed.
	inspectSQL = "SELECT h.token IS NOT NULL, COALESCE(h.kept, 0), COALESCE(h.fence, n.fence),\n" +
		"  COALESCE(h.instance, n.instance), COALESCE(h.label, n.label), COALESCE(h.value, n.value), COALESCE(h.shared, 0),\n" +
		"  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', COALESCE(h.acquired_at, n.acquired_at)),\n" +
		"  COALESCE(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), h.expires_at), 0),\n" +
		"  (SELECT COUNT(*) FROM {table} AS c WHERE c.name = n.name AND " + liveHolder + "),\n" +
		"  (SELECT COUNT(*) FROM {table} AS c WHERE c.name = n.name AND c.waiting AND c.expires_at > UTC_TIMESTAMP(6))\n" +
		"FROM {table} AS n LEFT JOIN {table} AS h ON h.name = n.name AND h.fence = (\n" +
		"  SELECT MAX(c.fence) FROM {table} AS c WHERE c.name = n.name AND " + liveHolder + ")\n" +
		"  AND h.token <> X'' AND NOT h.waiting\n" +
		"WHERE n.name = {name} AND n.token = X''"

	// listSQL pages through the live holds of the names in [from, to) after the cursor (a
	// name and a fence), in name and fence order, one row per holder.
	listSQL = "SELECT c.name, c.kept, c.fence, c.instance, c.label, c.value, c.shared,\n" +
		"  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', c.acquired_at),\n" +
		"  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), c.expires_at),\n" +
		"  (SELECT COUNT(*) FROM {table} AS o WHERE o.name = c.name AND o.token <> X'' AND NOT o.waiting\n" +
		"   AND o.expires_at > UTC_TIMESTAMP(6))\n" +
		"FROM {table} AS c\n" +
		"WHERE c.name >= {from} AND c.name < {to} AND (c.name > {cursor} OR c.name = {cursor} AND c.fence > {after})\n" +
		"  AND " + liveHolder + "\n" +
		"ORDER BY c.name, c.fence LIMIT {limit}"

	// idleSQL finds the names free since before {idle} ago — their row's last lease or place
	// ended that long ago, and none of their holders' or waiters' rows has been live since —
	// a page at a time, with a plain (non-locking) read; reclaimDeadSQL deletes those names'
	// dead rows, and reclaimSQL their names' rows, by primary key, checking again under the
	// row lock, so that it never deletes a name taken in between (a grant, or a new waiter,
	// moves the name's row's expires_at on).
	idleSQL = "SELECT n.name FROM {table} AS n\n" +
		"WHERE n.token = X'' AND n.name > {cursor} AND n.expires_at < UTC_TIMESTAMP(6) - INTERVAL {idle} MICROSECOND\n" +
		"  AND NOT EXISTS (SELECT 1 FROM {table} AS o WHERE o.name = n.name AND o.token <> X''\n" +
		"    AND o.expires_at >= UTC_TIMESTAMP(6) - INTERVAL {idle} MICROSECOND)\n" +
		"ORDER BY n.name LIMIT {limit}"
	reclaimDeadSQL = "DELETE FROM {table}\n" +
		"WHERE name IN ({names}) AND token <> X'' AND expires_at < UTC_TIMESTAMP(6) - INTERVAL {idle} MICROSECOND"
	reclaimSQL = "DELETE FROM {table}\n" +
		"WHERE name IN ({names}) AND token = X'' AND expires_at < UTC_TIMESTAMP(6) - INTERVAL {idle} MICROSECOND"

	// nowMicros is the database's time in microseconds since the Unix epoch, in UTC.
	nowMicros = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
)

// fill returns the statement q with each {slot} replaced by its literal; slotsAndLiterals
// alternates the two, and each slot starts with '{'. A literal is not looked into again. It
// builds the statement in one allocation, where a strings.Replacer made per statement cost
// dozens.
func fill(q string, slotsAndLiterals ...string) string {
	n := len(q)
	for i := 1; i < len(slotsAndLiterals); i += 2 {
		n += len(slotsAndLiterals[i])
	}
	var b strings.Builder
	b.Grow(n)
	for {
		i := strings.IndexByte(q, '{')
		if i < 0 {
			break
		}
		b.WriteString(q[:i])
		q = q[i:]
		skip := 0
		for j := 0; j+1 < len(slotsAndLiterals); j += 2 {
			if strings.HasPrefix(q, slotsAndLiterals[j]) {
				b.WriteString(slotsAndLiterals[j+1])
				skip = len(slotsAndLiterals[j])
				break
			}
		}
		if skip == 0 { // a '{' of no slot stays
			b.WriteByte('{')
			skip = 1
		}
		q = q[skip:]
	}
	b.WriteString(q)
	return b.String()
}

// bin returns s as a hexadecimal string literal, X'…': a binary string of exactly s's bytes.
func bin(s string) string {
	b := make([]byte, 0, 3+2*len(s))
	b = append(b, "X'"...)
	b = hex.AppendEncode(b, []byte(s))
	return string(append(b, '\''))
}

// maxText is the length, in characters, of the VARCHAR columns (instance, label).
const maxText = 255

// text returns s as a utf8mb4 literal for a VARCHAR(255) column: as text (display.Text: NUL
// and invalid UTF-8 replaced) cut to 255 characters, so that no sql_mode turns it into an
// error or a silent truncation that differs between servers.
func text(s string) string {
	return "_utf8mb4 " + bin(textBytes(s))
}

// textBytes returns s as text prepares it.
func textBytes(s string) string { return display.Cut(display.Text(s), maxText) }

// micros returns d in whole microseconds, as SQL.
func micros(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
