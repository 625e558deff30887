package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// SQLStore keeps the balances in a table of a PostgreSQL or MySQL/MariaDB database — the one
// the locks are on: httpapi_accounts, a row per account with its balance and the highest
// fence accepted. A write is an UPDATE … WHERE fence <= the writer's: the database refuses a
// stale holder's write on its own.
type SQLStore struct {
	db      *sql.DB
	dialect sqlDialect
}

// sqlDialect is what differs between PostgreSQL and MySQL for the store.
type sqlDialect struct {
	numbered    bool   // placeholders are $1, $2, … rather than ?
	createTable string // creates the table when it is missing
	insert      string // inserts an account with balance 0 and fence 0, unless it exists
}

// sqlColumns are the table's columns, with the type of the key's: the tenant and the ID must
// compare as the lock names do, byte for byte. PostgreSQL's VARCHAR does; MySQL's and
// MariaDB's does not under their default collations, which take "A" and "a" (and "a" and
// "a ") for one value — two locks, one row, and two withdrawals of one balance at once — so
// there they are VARBINARY.
func sqlColumns(key string) string {
	return `(tenant ` + key + ` NOT NULL, account ` + key + ` NOT NULL,
	balance BIGINT NOT NULL, fence BIGINT NOT NULL, PRIMARY KEY (tenant, account))`
}

// NewPostgresStore returns a Store on a PostgreSQL database (db from pgx's stdlib package,
// for example stdlib.OpenDBFromPool). Call CreateTable once before using it.
func NewPostgresStore(db *sql.DB) *SQLStore {
	return &SQLStore{db: db, dialect: sqlDialect{
		numbered:    true,
		createTable: `CREATE TABLE IF NOT EXISTS httpapi_accounts ` + sqlColumns(`VARCHAR(255)`),
		insert:      `INSERT INTO httpapi_accounts VALUES (?, ?, 0, 0) ON CONFLICT DO NOTHING`,
	}}
}

// NewMySQLStore returns a Store on a MySQL or MariaDB database (db from
// github.com/go-sql-driver/mysql). Call CreateTable once before using it.
func NewMySQLStore(db *sql.DB) *SQLStore {
	return &SQLStore{db: db, dialect: sqlDialect{
		createTable: `CREATE TABLE IF NOT EXISTS httpapi_accounts ` + sqlColumns(`VARBINARY(1020)`),
		insert:      `INSERT IGNORE INTO httpapi_accounts VALUES (?, ?, 0, 0)`,
	}}
}

// query returns q with its ? placeholders in the dialect's form.
func (d sqlDialect) query(q string) string {
	if !d.numbered {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// CreateTable creates the table httpapi_accounts when it is missing. Two processes that
// create it at once may fail: run it under a lock. It leaves a table that exists alone: on
// MySQL or MariaDB, drop one whose key columns are VARCHAR (made by an earlier version of
// this example), or accounts whose IDs differ only in case share a row.
func (s *SQLStore) CreateTable(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, s.dialect.createTable)
	return err
}

// Balance implements Store.
func (s *SQLStore) Balance(ctx context.Context, a Account) (int64, uint64, error) {
	var balance, fence int64
	err := s.db.QueryRowContext(ctx, s.dialect.query(
		`SELECT balance, fence FROM httpapi_accounts WHERE tenant = ? AND account = ?`), a.Tenant, a.ID).Scan(&balance, &fence)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, nil
	}
	return balance, uint64(fence), err
}

// Update implements Store.
func (s *SQLStore) Update(ctx context.Context, a Account, fence uint64, change func(int64) (int64, error)) (int64, error) {
	if fence > math.MaxInt64 {
		return 0, fmt.Errorf("accounts: fence %d does not fit the fence column", fence)
	}
	balance, seen, err := prepare(ctx, s, a, fence, change)
	if err != nil {
		return 0, err
	}
	if seen == 0 { // perhaps a new account
		if _, err := s.db.ExecContext(ctx, s.dialect.query(s.dialect.insert), a.Tenant, a.ID); err != nil {
			return 0, err
		}
	}
	// The UPDATE commits on its own (no transaction): one whose reply is cut off may have been
	// made, so it goes through write like the other stores' writes.
	var n int64
	err = write(ctx, func(ctx context.Context) error {
		res, err := s.db.ExecContext(ctx, s.dialect.query(
			`UPDATE httpapi_accounts SET balance = ?, fence = ? WHERE tenant = ? AND account = ? AND fence <= ?`),
			balance, int64(fence), a.Tenant, a.ID, int64(fence))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, err
	}
	if n == 1 {
		return balance, nil
	}
	// No row changed: a higher fence was accepted since the read — or, on MySQL, which
	// counts only the rows whose values changed, the row already held these values.
	if _, seen, err = s.Balance(ctx, a); err != nil {
		return 0, err
	}
	if fence < seen {
		return 0, staleFence(a, fence, seen)
	}
	return balance, nil
}
