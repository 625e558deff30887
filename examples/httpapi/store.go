package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Store keeps the balances of accounts: the database that the instances of the service share.
// Every write carries the fence of the lock it was made under, and a Store refuses a write
// whose fence is lower than one it already accepted for the account — the write of a holder
// that paused while its lock expired and someone else took it.
//
// Ledger keeps them in memory, for the embedded backend; RedisStore, SQLStore, MongoStore and
// EtcdStore keep them on the server the locks are on, so that every process sees them.
type Store interface {
	// Balance returns the balance of a and the highest fence accepted for it; 0 and 0 for
	// an account never written.
	Balance(ctx context.Context, a Account) (balance int64, fence uint64, err error)
	// Update reads the balance of a, passes it to change, and writes what change returns as
	// the new balance, under fence; it returns the new balance. It returns change's error
	// and writes nothing when change fails; an error matching ErrStaleFence, and writes
	// nothing, when the store accepted a higher fence for a (before the read, or between the
	// read and the write). Update does not keep other writers of a out between the read and
	// the write: the account's lock does.
	Update(ctx context.Context, a Account, fence uint64, change func(balance int64) (int64, error)) (int64, error)
}

// Errors of the stores. Match them with errors.Is.
var (
	// ErrStaleFence reports a write whose fence is lower than one the store already
	// accepted for the account: its lock was lost, and a newer holder has written since.
	ErrStaleFence = errors.New("accounts: stale fence")
	// ErrInsufficientFunds reports a withdrawal larger than the balance.
	ErrInsufficientFunds = errors.New("accounts: insufficient funds")
	// ErrOutcomeUnknown reports a write that was sent but not answered — a timeout, a
	// broken connection: the server may have made it or not. Read the balance before trying
	// again, or a deposit may be made twice.
	ErrOutcomeUnknown = errors.New("accounts: the write's outcome is unknown")
	// ErrTxDone reports a Commit after Commit or Rollback.
	ErrTxDone = errors.New("accounts: transaction already ended")
)

// Account names an account of a tenant.
type Account struct {
	Tenant string
	ID     string
}

func staleFence(a Account, fence, seen uint64) error {
	return fmt.Errorf("%w: fence %d on account %q of tenant %q, which has accepted fence %d",
		ErrStaleFence, fence, a.ID, a.Tenant, seen)
}

// prepare is the read of a store's Update: it reads the balance of a with s.Balance, refuses a
// fence lower than the one accepted, and returns the new balance change computes, and the
// fence read.
func prepare(ctx context.Context, s Store, a Account, fence uint64, change func(int64) (int64, error)) (int64, uint64, error) {
	balance, seen, err := s.Balance(ctx, a)
	if err != nil {
		return 0, 0, err
	}
	if fence < seen {
		return 0, 0, staleFence(a, fence, seen)
	}
	balance, err = change(balance)
	return balance, seen, err
}

// CommitTimeout bounds a store's write once it is sent.
const CommitTimeout = 5 * time.Second

// write sends a store's write with send, and sees it through: ctx's end does not cut it off
// half-way, which would leave the caller not knowing whether the server made it (the driver
// returns ctx's error though the write may have landed). Sending past the end of ctx is safe:
// a holder whose lock was lost meanwhile writes under its fence, which the store refuses once
// a newer holder wrote.
//
// It returns ctx's cause, and sends nothing, when ctx has ended already; an error matching
// ErrOutcomeUnknown when send fails, for a write that was sent may have been made. send
// returns only such failures: an answer that says what happened (a stale fence) it keeps for
// its caller.
func write(ctx context.Context, send func(ctx context.Context) error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CommitTimeout)
	defer cancel()
	if err := send(wctx); err != nil {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return nil
}
