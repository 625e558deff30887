package main

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Balance reads share the account's lock, and writes hold it alone: while another instance
// holds the read side of an account (a slow read), a balance read of it through this instance
// goes through at once and a deposit is refused; while another instance holds the write side,
// a balance read is refused too. Instances that do not wait make "at once" a status.
func TestReadsShareTheAccount(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s := newService(t, b.start(t), 2, WithWaitTime(0))
			ctx := t.Context()
			require.Equal(t, http.StatusOK, s.do(t, 0, "acme", "42", "deposit", 100).status)
			const name = "tenant:acme:account:42"

			rw, err := s.guards[1].RWMutex(name)
			require.NoError(t, err)
			reader, err := rw.RLock(ctx)
			require.NoError(t, err)
			got := s.do(t, 0, "acme", "42", "", 0)
			assert.Equal(t, http.StatusOK, got.status, "a read beside another instance's read: %v", got.problem)
			assert.Equal(t, int64(100), got.balance.Balance)
			busy := s.do(t, 0, "acme", "42", "deposit", 5)
			assert.Equal(t, http.StatusLocked, busy.status, "a write while another instance reads")
			require.NoError(t, reader.Release(ctx))

			writer, err := s.guards[1].TryAcquire(ctx, name) // a plain lock on the name is a writer
			require.NoError(t, err)
			busy = s.do(t, 0, "acme", "42", "", 0)
			assert.Equal(t, http.StatusLocked, busy.status, "a read while another instance writes")
			assert.Equal(t, http.StatusOK, s.do(t, 0, "acme", "7", "", 0).status, "another account is not held up")
			require.NoError(t, writer.Release(ctx))

			assert.Equal(t, http.StatusOK, s.do(t, 0, "acme", "42", "", 0).status)
		})
	}
}

// A balance read that comes while a slow withdrawal holds the account waits for it and
// answers the balance after it, with the withdrawal's fence — never the balance from before
// a write that has begun; and while writes run one after another through every instance,
// reads through every instance only ever answer a balance and a fence that one write left
// together. On the Ledger no read ever ran while a write was between its read and its write.
func TestReadsSeeWholeWrites(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			const work = 200 * time.Millisecond
			s := newService(t, b.start(t), 2, WithWork(work), WithWaitTime(20*time.Second))
			require.Equal(t, http.StatusOK, s.do(t, 0, "acme", "42", "deposit", 100).status)

			// One slow withdrawal through instance 0; once it holds the account, a read
			// through instance 1.
			withdrawn := make(chan response, 1)
			go func() { withdrawn <- s.do(t, 0, "acme", "42", "withdraw", 30) }()
			require.Eventually(t, func() bool { return s.started("accounts.withdraw") == 1 },
				10*time.Second, time.Millisecond, "the withdrawal holds the account")
			read := s.do(t, 1, "acme", "42", "", 0)
			w := <-withdrawn
			require.Equal(t, http.StatusOK, w.status, "%v", w.problem)
			require.Equal(t, http.StatusOK, read.status, "%v", read.problem)
			assert.Equal(t, []any{int64(70), w.balance.Fence}, []any{read.balance.Balance, read.balance.Fence},
				"the read that came during the withdrawal answers the balance after it")

			// Deposits of 1, 2, 3, … through both instances, and reads through both at the
			// same time: every read answers a pair that a write left.
			const writes, readers = 6, 4
			var mu sync.Mutex
			left := map[uint64]int64{w.balance.Fence: 70} // fence → balance, by the writes
			var reads []Balance
			var wg sync.WaitGroup
			done := make(chan struct{})
			for i := range writes {
				wg.Go(func() {
					r := s.do(t, i%2, "acme", "42", "deposit", int64(i+1))
					if assert.Equal(t, http.StatusOK, r.status, "%v", r.problem) {
						mu.Lock()
						left[r.balance.Fence] = r.balance.Balance
						mu.Unlock()
					}
				})
			}
			var rg sync.WaitGroup
			for i := range readers {
				rg.Go(func() {
					for {
						select {
						case <-done:
							return
						default:
						}
						r := s.do(t, i%2, "acme", "42", "", 0)
						if assert.Equal(t, http.StatusOK, r.status, "%v", r.problem) {
							mu.Lock()
							reads = append(reads, r.balance)
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			close(done)
			rg.Wait()
			require.NotEmpty(t, reads)
			for _, r := range reads {
				want, ok := left[r.Fence]
				if assert.True(t, ok, "a read answered fence %d, which no write left", r.Fence) {
					assert.Equal(t, want, r.Balance, "the balance that the write of fence %d left", r.Fence)
				}
			}
			balance, _ := s.balance(t, "acme", "42")
			assert.Equal(t, int64(70+writes*(writes+1)/2), balance)
			if ledger, ok := s.store.(*Ledger); ok {
				assert.Zero(t, ledger.DirtyReads(), "balance reads ran while a write of the account was open")
				assert.Zero(t, ledger.Overlaps(), "read-modify-writes of one account overlapped")
			}
			t.Logf("%d reads during %d writes of %v each", len(reads), writes, work)
		})
	}
}

// started counts the spans called name that have started.
func (s *fleet) started(name string) int {
	n := 0
	for _, span := range s.spans.Started() {
		if span.Name() == name {
			n++
		}
	}
	return n
}
