package accounts

import (
	"errors"
	"fmt"
	"sync"
)

// Errors of the ledger. Match them with errors.Is.
var (
	// ErrStaleFence reports a transaction whose fence is lower than one the ledger already
	// accepted for the account: its lock was lost, and a newer holder has written since.
	ErrStaleFence = errors.New("accounts: stale fence")
	// ErrInsufficientFunds reports a withdrawal larger than the balance.
	ErrInsufficientFunds = errors.New("accounts: insufficient funds")
	// ErrTxDone reports a Commit after Commit or Rollback.
	ErrTxDone = errors.New("accounts: transaction already ended")
)

// Account names an account of a tenant.
type Account struct {
	Tenant string
	ID     string
}

// Ledger keeps the balances of accounts in memory: it stands for the database that the
// instances of a service share. For each account it remembers the highest fence it accepted,
// and it counts overlaps: read-modify-writes of one account that were open at the same time,
// which a lock around them rules out. Its zero value is an empty ledger. A Ledger is safe for
// concurrent use.
type Ledger struct {
	mu       sync.Mutex // protects accounts and overlaps
	accounts map[Account]*entry
	overlaps int
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
// account never written.
func (l *Ledger) Balance(a Account) (balance int64, fence uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.accounts[a]; e != nil {
		return e.balance, e.fence
	}
	return 0, 0
}

// Overlaps returns how many transactions began while another one on the same account was
// open. Under a lock per account it stays 0.
func (l *Ledger) Overlaps() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overlaps
}

func staleFence(a Account, fence, seen uint64) error {
	return fmt.Errorf("%w: fence %d on account %q of tenant %q, which has accepted fence %d",
		ErrStaleFence, fence, a.ID, a.Tenant, seen)
}
