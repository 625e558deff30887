package mongostore_test

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/mongostore"
)

// TestClockUncertainty: two stores whose estimates of the server's clock err in opposite
// directions, each within the uncertainty it states. Every expiry decision must allow for the
// uncertainty on both sides — a lease is written to end no earlier than its TTL after the
// latest the server's time may be, and judged over no sooner than the earliest it may be —
// so that no store takes a lock that another granted before its TTL has passed on the server.
func TestClockUncertainty(t *testing.T) {
	srv := testserver.StartMongo(t)
	const (
		err = 2 * time.Second // how far each estimate is off, and the uncertainty it states
		ttl = 3 * time.Second
	)
	early, late := newClient(t, srv), newClient(t, srv)
	mongostore.SkewClock(early.store, -err, err)
	mongostore.SkewClock(late.store, err, err)

	for _, tc := range []struct {
		name          string
		holder, taker *client
	}{
		{"early holder, late taker", early, late},
		{"late holder, early taker", late, early},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "clock:" + rand.Text()
			granted := time.Now()
			holder := guard.Request{Name: name, Token: rand.Text(), TTL: ttl}
			_, err := tc.holder.store.Acquire(t.Context(), holder)
			require.NoError(t, err)
			_, err = tc.taker.store.Acquire(t.Context(), guard.Request{Name: name, Token: rand.Text(), TTL: ttl})
			if time.Since(granted) < ttl { // the lease lasts on the server
				require.ErrorIs(t, err, guard.ErrNotAcquired, "taken %v after a grant of %v", time.Since(granted), ttl)
			}
			info, err := tc.taker.store.Inspect(t.Context(), name)
			require.NoError(t, err)
			if time.Since(granted) < ttl {
				assert.True(t, info.Held, "a held lock inspected as free")
			}
			errs := tc.holder.store.Extend(t.Context(), []guard.Lease{{Name: name, Token: holder.Token, TTL: ttl}})
			assert.NoError(t, errs[0], "the holder could not extend its live lock")
			require.NoError(t, tc.holder.store.Release(t.Context(), name, holder.Token, 0))
		})
	}
}
