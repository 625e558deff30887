package mysqlstore

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
	// createTableSQL is the schema; the DDL in docs/backends.md is a copy.
	createTableSQL = "CREATE TABLE IF NOT EXISTS {table} (\n" +
		"  name        VARBINARY(1024) NOT NULL COMMENT 'the lock name, compared byte by byte',\n" +
		"  owner       VARBINARY(255)  NOT NULL COMMENT 'the holder''s token; empty once released, or kept for a MinHold window',\n" +
		"  fence       BIGINT UNSIGNED NOT NULL COMMENT 'the last fence given; only grows',\n" +
		"  expires_at  DATETIME(6)     NOT NULL COMMENT 'end of the lease (UTC, database clock); the name is taken while it is in the future',\n" +
		"  acquired_at DATETIME(6)     NOT NULL COMMENT 'when the holder took it (UTC, database clock)',\n" +
		"  instance    VARCHAR(255)    NOT NULL COMMENT 'who took it (guard.WithInstance)',\n" +
		"  label       VARCHAR(255)    NOT NULL COMMENT 'the acquisition''s guard.Label',\n" +
		"  PRIMARY KEY (name)\n" +
		") ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

	// acquireSQL inserts the row of a name never seen, or takes over an existing one. The
	// answer comes back in the OK packet's last-insert id, set by LAST_INSERT_ID(expr): the
	// fence when the lock is taken, or — with the top bit set — the holder's remaining lease
	// in microseconds when it is busy (see decodeAcquire). The VALUES list is evaluated
	// first, even for a name that has a row, and sets it to now; every branch of the fence
	// CASE then sets it again, the busy one as "fence + 0 * LAST_INSERT_ID(…)", which leaves
	// the fence as it was.
	//
	// MySQL and MariaDB evaluate the assignments of ON DUPLICATE KEY UPDATE left to right,
	// each seeing the columns already assigned (MariaDB's SIMULTANEOUS_ASSIGNMENT sql_mode
	// lets them all see the old row instead). The statement gives the same result either
	// way:
	//   - fence, acquired_at, instance and label come before owner and expires_at, so they
	//     test "expires_at <= now" and "owner = token" on the old row;
	//   - owner and expires_at test "expires_at <= now OR owner = token", which is true of
	//     the old row exactly when it is true after owner was set: a take sets owner to the
	//     token, and a busy row changes nothing.
	// A retry by the token that holds the name (its reply was lost) matches "owner = token"
	// and keeps the fence; a name whose lease ended gets GREATEST(fence + 1, now in µs), which
	// still increases after the row was deleted (Reclaim, an operator) as long as the
	// database's clock has not stepped back further than the time since the row was last
	// taken.
	acquireSQL = "INSERT INTO {table} (name, owner, fence, expires_at, acquired_at, instance, label)\n" +
		"VALUES ({name}, {token}, LAST_INSERT_ID(" + nowMicros + "),\n" +
		"  UTC_TIMESTAMP(6) + INTERVAL {ttl} MICROSECOND, UTC_TIMESTAMP(6), {instance}, {label})\n" +
		"ON DUPLICATE KEY UPDATE\n" +
		"  fence = CASE\n" +
		"    WHEN expires_at <= UTC_TIMESTAMP(6) THEN LAST_INSERT_ID(GREATEST(fence + 1, " + nowMicros + "))\n" +
		"    WHEN owner = {token} THEN LAST_INSERT_ID(fence)\n" +
		"    ELSE fence + 0 * LAST_INSERT_ID((1 << 63) | TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at))\n" +
		"  END,\n" +
		"  acquired_at = IF(expires_at <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), acquired_at),\n" +
		"  instance = IF(expires_at <= UTC_TIMESTAMP(6), {instance}, instance),\n" +
		"  label = IF(expires_at <= UTC_TIMESTAMP(6), {label}, label),\n" +
		"  owner = IF(expires_at <= UTC_TIMESTAMP(6) OR owner = {token}, {token}, owner),\n" +
		"  expires_at = IF(expires_at <= UTC_TIMESTAMP(6) OR owner = {token},\n" +
		"    UTC_TIMESTAMP(6) + INTERVAL {ttl} MICROSECOND, expires_at)"

	// extendSQL sets the lease of every (name, token) pair of the batch that still holds its
	// name; {ttl} is one number of microseconds, or a CASE on name when the leases differ.
	// A row constructor IN list on the primary key is a range scan that locks only those
	// rows, in key order. The number of rows changed is the number of leases extended.
	extendSQL = "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL {ttl} MICROSECOND\n" +
		"WHERE (name, owner) IN ({pairs}) AND expires_at > UTC_TIMESTAMP(6)"

	// heldSQL reads which names of a batch are held, and by whom, when an Extend changed
	// some of its rows but not all.
	heldSQL = "SELECT name, owner FROM {table}\n" +
		"WHERE name IN ({names}) AND expires_at > UTC_TIMESTAMP(6)"

	// releaseSQL gives a name up if the token holds it: the row stays, with its fence, and
	// no owner. {keep} is 0 for a plain release, so the name is free from now on (and
	// expires_at says since when, for Reclaim); with a MinHold window left it is the rest of
	// the window, during which no token can extend or release the lock.
	releaseSQL = "UPDATE {table} SET owner = X'', expires_at = UTC_TIMESTAMP(6) + INTERVAL {keep} MICROSECOND\n" +
		"WHERE name = {name} AND owner = {token} AND expires_at > UTC_TIMESTAMP(6)"

	// forceReleaseSQL frees a name whoever holds it, keeping its fence.
	forceReleaseSQL = "UPDATE {table} SET owner = X'', expires_at = UTC_TIMESTAMP(6)\n" +
		"WHERE name = {name} AND expires_at > UTC_TIMESTAMP(6)"

	// infoColumns are what Inspect and List read of a row: whether it has no owner, the
	// fence, the holder's metadata, when it was acquired (µs since the epoch) and the rest
	// of its lease in µs (not positive when free).
	infoColumns = "owner = X'', fence, instance, label,\n" +
		"  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', acquired_at),\n" +
		"  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)"

	inspectSQL = "SELECT " + infoColumns + "\nFROM {table} WHERE name = {name}"

	// listSQL pages through the held names in [from, to) after cursor, in name order.
	listSQL = "SELECT name, " + infoColumns + "\nFROM {table}\n" +
		"WHERE name >= {from} AND name < {to} AND name > {cursor} AND expires_at > UTC_TIMESTAMP(6)\n" +
		"ORDER BY name LIMIT {limit}"

	// idleSQL finds names free since before {idle} ago, a page at a time, with a plain
	// (non-locking) read; reclaimSQL deletes them by primary key, checking again under the
	// row lock, so that it never deletes a row taken in between.
	idleSQL = "SELECT name FROM {table}\n" +
		"WHERE name > {cursor} AND expires_at < UTC_TIMESTAMP(6) - INTERVAL {idle} MICROSECOND\n" +
		"ORDER BY name LIMIT {limit}"
	reclaimSQL = "DELETE FROM {table}\n" +
		"WHERE name IN ({names}) AND expires_at < UTC_TIMESTAMP(6) - INTERVAL {idle} MICROSECOND"

	// nowMicros is the database's time in microseconds since the Unix epoch, in UTC.
	nowMicros = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
)

// busyBit marks the acquire answer that carries a holder's remaining lease, not a fence.
const busyBit = 1 << 63

// decodeAcquire reads the answer of acquireSQL.
func decodeAcquire(id int64) (fence uint64, remaining time.Duration, busy bool) {
	v := uint64(id)
	if v&busyBit != 0 {
		return 0, time.Duration(v&^busyBit) * time.Microsecond, true
	}
	return v, 0, false
}

// fill returns the statement q with each {slot} replaced by its literal; slotsAndLiterals
// alternates the two.
func fill(q string, slotsAndLiterals ...string) string {
	return strings.NewReplacer(slotsAndLiterals...).Replace(q)
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

// text returns s as a utf8mb4 literal for a VARCHAR(255) column: invalid UTF-8 replaced and
// cut to 255 characters, so that no sql_mode turns it into an error or a silent truncation
// that differs between servers.
func text(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if utf8.RuneCountInString(s) > maxText {
		n := 0
		for i := range s {
			if n == maxText {
				s = s[:i]
				break
			}
			n++
		}
	}
	return "_utf8mb4 " + bin(s)
}

// micros returns d in whole microseconds, as SQL.
func micros(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
