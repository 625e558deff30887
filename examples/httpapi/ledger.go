package main

import (
	"context"
	"sync"
)

// Ledger is the Store of the embedded backend: it keeps the balances in memory, so it serves
// the instances of one process. For each account it remembers the highest fence it accepted,
// and it counts overlaps: read-modify-writes of one account that were open at the same time,
// and balance reads made while a read-modify-write of the account was open (the read of a
// change half made, in a store whose write is more than one step), which a read-write lock
// around them rules out. Its zero value is an empty ledger. A Ledger is safe for
// concurrent use.
type Ledger struct {
	mu         sync.Mutex // protects accounts, overlaps and dirtyReads
	accounts   map[Account]*entry
	overlaps   int
	dirtyReads int
}

// entry is one account.
type entry struct {
	balance int64
	fence   uint64 // the highest fence accepted
	open    int    // transactions begun and not yet ended
}

// Tx is one read-modify-write of an account: Begin reads the balance, Commit writes the new
// one. Between the two, another writer of the account would interleave if nothing kept it
// out. A Tx is used by one goroutine.
type Tx struct {
	l       *Ledger
	account Account
	fence   uint64
	balance int64
	done    bool // guarded by l.mu
}

// account returns the entry of a, creating it. l.mu must be held.
func (l *Ledger) account(a Account) *entry {
	if l.accounts == nil {
		l.accounts = make(map[Account]*entry)
	}
	e := l.accounts[a]
	if e == nil {
		e = &entry{}
		l.accounts[a] = e
	}
	return e
}

// Begin starts a transaction on account a, made under a lock with the given fence. It returns
// an error matching ErrStaleFence when the ledger already accepted a higher fence for a. End
// the transaction with Commit or Rollback.
func (l *Ledger) Begin(a Account, fence uint64) (*Tx, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.account(a)
	if fence < e.fence {
		return nil, staleFence(a, fence, e.fence)
	}
	e.open++
	if e.open > 1 {
		l.overlaps++
	}
	return &Tx{l: l, account: a, fence: fence, balance: e.balance}, nil
}

// Balance returns the balance the transaction read.
func (t *Tx) Balance() int64 { return t.balance }

// Commit writes balance as the account's new balance and ends the transaction. It returns an
// error matching ErrStaleFence, and writes nothing, when the ledger accepted a higher fence
// for the account since Begin; ErrTxDone when the transaction had already ended.
func (t *Tx) Commit(balance int64) error {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	if t.done {
		return ErrTxDone
	}
	t.done = true
	e := t.l.account(t.account)
	e.open--
	if t.fence < e.fence {
		return staleFence(t.account, t.fence, e.fence)
	}
	e.balance, e.fence = balance, t.fence
	return nil
}

// Rollback ends the transaction without writing. It does nothing after Commit or Rollback.
func (t *Tx) Rollback() {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	if !t.done {
		t.done = true
		t.l.account(t.account).open--
	}
}

// Balance returns the balance of a and the highest fence accepted for it; 0 and 0 for an
// account never written. It never fails. A read while a transaction on a is open counts in
// DirtyReads.
func (l *Ledger) Balance(_ context.Context, a Account) (balance int64, fence uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.accounts[a]; e != nil {
		if e.open > 0 {
			l.dirtyReads++
		}
		return e.balance, e.fence, nil
	}
	return 0, 0, nil
}

// Update runs change in one transaction (Begin, then Commit or Rollback).
func (l *Ledger) Update(_ context.Context, a Account, fence uint64, change func(balance int64) (int64, error)) (int64, error) {
	tx, err := l.Begin(a, fence)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	balance, err := change(tx.Balance())
	if err != nil {
		return 0, err
	}
	return balance, tx.Commit(balance)
}

// Overlaps returns how many transactions began while another one on the same account was
// open. Under a lock per account it stays 0.
func (l *Ledger) Overlaps() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overlaps
}

// DirtyReads returns how many Balance reads of an account were made while a transaction on it
// was open: in a store whose write is more than one step, reads that could see a change half
// made. Under the read side of a read-write lock per account, whose write side the
// transactions hold, it stays 0.
func (l *Ledger) DirtyReads() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dirtyReads
}
