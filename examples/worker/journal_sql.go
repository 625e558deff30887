package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// sqlJournal keeps the journal in three tables of the SQL database of the locks: worker_runs,
// one row holding the current run as JSON; worker_events, a row per event; and worker_tasks, a
// row per task of a run with the fence that claimed it last and whether it is done. A done
// record is one transaction: an UPDATE of the task's row that checks the fence, and the
// event's row.
type sqlJournal struct {
	db      *sql.DB
	dialect sqlDialect
}

// sqlDialect is what differs between PostgreSQL and MySQL for the journal.
type sqlDialect struct {
	numbered   bool     // placeholders are $1, $2, … rather than ?
	schema     []string // statements that create the tables when they are missing
	upsertRun  string   // sets the current run: its JSON is the one argument
	insertTask string   // adds a task's row (run, item) with fence 0, unless it exists
}

// tasksTable is the table of the tasks' fences, the same in both dialects.
const tasksTable = `CREATE TABLE IF NOT EXISTS worker_tasks (run VARCHAR(64) NOT NULL, item BIGINT NOT NULL,
	fence BIGINT NOT NULL, done SMALLINT NOT NULL, PRIMARY KEY (run, item))`

var (
	postgresJournal = sqlDialect{
		numbered: true,
		schema: []string{
			`CREATE TABLE IF NOT EXISTS worker_runs (name VARCHAR(16) PRIMARY KEY, run TEXT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS worker_events (run VARCHAR(64) NOT NULL, kind SMALLINT NOT NULL,
				item BIGINT NOT NULL, instance VARCHAR(64) NOT NULL, fence BIGINT NOT NULL,
				started BIGINT NOT NULL, ended BIGINT NOT NULL)`,
			`CREATE INDEX IF NOT EXISTS worker_events_item ON worker_events (run, kind, item)`,
			tasksTable,
		},
		upsertRun: `INSERT INTO worker_runs (name, run) VALUES ('current', ?)
			ON CONFLICT (name) DO UPDATE SET run = EXCLUDED.run`,
		insertTask: `INSERT INTO worker_tasks (run, item, fence, done) VALUES (?, ?, 0, 0) ON CONFLICT DO NOTHING`,
	}
	mysqlJournal = sqlDialect{
		schema: []string{
			`CREATE TABLE IF NOT EXISTS worker_runs (name VARCHAR(16) PRIMARY KEY, run TEXT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS worker_events (run VARCHAR(64) NOT NULL, kind SMALLINT NOT NULL,
				item BIGINT NOT NULL, instance VARCHAR(64) NOT NULL, fence BIGINT NOT NULL,
				started BIGINT NOT NULL, ended BIGINT NOT NULL, INDEX worker_events_item (run, kind, item))`,
			tasksTable,
		},
		upsertRun: `INSERT INTO worker_runs (name, run) VALUES ('current', ?)
			ON DUPLICATE KEY UPDATE run = VALUES(run)`,
		insertTask: `INSERT IGNORE INTO worker_tasks (run, item, fence, done) VALUES (?, ?, 0, 0)`,
	}
)

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

func (j sqlJournal) setup(ctx context.Context) error {
	for _, q := range j.dialect.schema {
		if _, err := j.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

func (j sqlJournal) current(ctx context.Context) (runRecord, bool, error) {
	var b []byte
	err := j.db.QueryRowContext(ctx, `SELECT run FROM worker_runs WHERE name = 'current'`).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return runRecord{}, false, nil
	}
	if err != nil {
		return runRecord{}, false, err
	}
	var r runRecord
	return r, true, json.Unmarshal(b, &r)
}

func (j sqlJournal) begin(ctx context.Context, r runRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = j.db.ExecContext(ctx, j.dialect.query(j.dialect.upsertRun), string(b))
	return err
}

// sqlExec is what sqlJournal writes with: the database, or a transaction.
type sqlExec interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (j sqlJournal) add(ctx context.Context, id string, e event) error {
	return j.insertEvent(ctx, j.db, id, e)
}

func (j sqlJournal) insertEvent(ctx context.Context, db sqlExec, id string, e event) error {
	if e.Fence > math.MaxInt64 {
		return fmt.Errorf("fence %d does not fit the fence column", e.Fence)
	}
	var ended int64
	if !e.End.IsZero() {
		ended = e.End.UnixNano()
	}
	_, err := db.ExecContext(ctx, j.dialect.query(
		`INSERT INTO worker_events (run, kind, item, instance, fence, started, ended) VALUES (?, ?, ?, ?, ?, ?, ?)`),
		id, int(e.Kind), e.Key, e.Instance, int64(e.Fence), e.Start.UnixNano(), ended)
	return err
}

// task returns the state of task in run id, after adding its row when it is missing.
func (j sqlJournal) task(ctx context.Context, db sqlExec, id string, task int64) (taskState, error) {
	if _, err := db.ExecContext(ctx, j.dialect.query(j.dialect.insertTask), id, task); err != nil {
		return taskState{}, err
	}
	var fence int64
	var done int
	err := db.QueryRowContext(ctx, j.dialect.query(`SELECT fence, done FROM worker_tasks WHERE run = ? AND item = ?`),
		id, task).Scan(&fence, &done)
	return taskState{fence: uint64(fence), done: done != 0}, err
}

func (j sqlJournal) claim(ctx context.Context, id string, task int64, fence uint64) error {
	if fence > math.MaxInt64 {
		return fmt.Errorf("fence %d does not fit the fence column", fence)
	}
	if _, err := j.task(ctx, j.db, id, task); err != nil {
		return err
	}
	// The UPDATE decides; the row read after it says why it changed nothing, if it did not.
	if _, err := j.db.ExecContext(ctx, j.dialect.query(
		`UPDATE worker_tasks SET fence = ? WHERE run = ? AND item = ? AND done = 0 AND fence <= ?`),
		int64(fence), id, task, int64(fence)); err != nil {
		return err
	}
	s, err := j.task(ctx, j.db, id, task)
	if err != nil {
		return err
	}
	if s.done {
		return errDone
	}
	if fence < s.fence {
		return errStale
	}
	return nil
}

func (j sqlJournal) finish(ctx context.Context, id string, e event) (err error) {
	if e.Fence > math.MaxInt64 {
		return fmt.Errorf("fence %d does not fit the fence column", e.Fence)
	}
	tx, err := j.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err == nil || errors.Is(err, errDone) || errors.Is(err, errStale) {
			if cerr := tx.Commit(); cerr != nil {
				err = cerr
			}
			return
		}
		_ = tx.Rollback()
	}()
	if _, err := j.task(ctx, tx, id, e.Key); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, j.dialect.query(
		`UPDATE worker_tasks SET done = 1, fence = ? WHERE run = ? AND item = ? AND done = 0 AND fence <= ?`),
		int64(e.Fence), id, e.Key, int64(e.Fence))
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 1 { // done 0 → 1: a change even for MySQL, which counts only changed rows
		return j.insertEvent(ctx, tx, id, e)
	}
	s, err := j.task(ctx, tx, id, e.Key)
	if err != nil {
		return err
	}
	_, again, refused := finishTask(s, e.Fence)
	if again {
		return nil
	}
	if refused == nil { // the row said yes after the UPDATE said no: it changed in between
		return fmt.Errorf("task %d of run %s changed while it was recorded done", e.Key, id)
	}
	e.Kind = staleTask
	return errors.Join(refused, j.insertEvent(ctx, tx, id, e))
}

func (j sqlJournal) done(ctx context.Context, id string, task int64) (bool, error) {
	var n int
	err := j.db.QueryRowContext(ctx, j.dialect.query(
		`SELECT COUNT(*) FROM worker_tasks WHERE run = ? AND item = ? AND done = 1`), id, task).Scan(&n)
	return n > 0, err
}

func (j sqlJournal) events(ctx context.Context, id string) ([]event, error) {
	rows, err := j.db.QueryContext(ctx, j.dialect.query(
		`SELECT kind, item, instance, fence, started, ended FROM worker_events WHERE run = ?`), id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var events []event
	for rows.Next() {
		var (
			e              event
			k              int
			fence          int64
			started, ended int64
		)
		if err := rows.Scan(&k, &e.Key, &e.Instance, &fence, &started, &ended); err != nil {
			return nil, err
		}
		e.Kind, e.Fence, e.Start = kind(k), uint64(fence), time.Unix(0, started)
		if ended != 0 {
			e.End = time.Unix(0, ended)
		}
		events = append(events, e)
	}
	return events, rows.Err()
}
