package pgstore

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
)

// notices is a Subscription's callback that hands each notice to the test.
type notices chan guard.Notice

func (n notices) notify(x guard.Notice) {
	select {
	case n <- x:
	default:
		panic("notices: the test is not reading")
	}
}

// next returns the next notice, failing the test after 10 s.
func (n notices) next(t *testing.T) guard.Notice {
	t.Helper()
	select {
	case x := <-n:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no notice")
		return guard.Notice{}
	}
}

// none checks that no notice is waiting. Every notice is sent before the statement that
// sent it returns: a later statement's notice arrives after it, so checking after the next
// awaited notice is enough.
func (n notices) none(t *testing.T) {
	t.Helper()
	select {
	case x := <-n:
		t.Fatalf("unexpected notice %+v", x)
	default:
	}
}

// subscribe opens a subscription of st that watches names, closed when the test ends.
func subscribe(t *testing.T, st *Store, names ...string) (*subscription, notices) {
	t.Helper()
	n := make(notices, 64)
	s, err := st.Subscribe(n.notify)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	for _, name := range names {
		require.NoError(t, s.Watch(t.Context(), name))
	}
	return s.(*subscription), n
}

// take acquires name for a new token and returns the token.
func take(t *testing.T, st *Store, name string) string {
	t.Helper()
	tok := rand.Text()
	_, err := st.Acquire(t.Context(), guard.Request{Name: name, Token: tok, TTL: time.Minute})
	require.NoError(t, err)
	return tok
}

func TestSubscription(t *testing.T) {
	srv := startServer(t)
	st, _ := srv.store(t)
	other, _ := srv.store(t) // the releases come from another pool, as from another process
	ctx := t.Context()

	t.Run("Release", func(t *testing.T) {
		watched, unwatched := "sub:w:"+rand.Text(), "sub:u:"+rand.Text()
		_, n := subscribe(t, st, watched)
		tu, tw := take(t, other, unwatched), take(t, other, watched)
		require.NoError(t, other.Release(ctx, unwatched, tu, 0))
		require.NoError(t, other.Release(ctx, watched, tw, 0))
		assert.Equal(t, guard.Notice{Name: watched, Token: tw}, n.next(t))
		n.none(t)
	})
	t.Run("MinHoldKeep", func(t *testing.T) {
		name := "sub:keep:" + rand.Text()
		_, n := subscribe(t, st, name)
		tok := take(t, other, name)
		require.NoError(t, other.Release(ctx, name, tok, time.Minute))
		assert.Equal(t, guard.Notice{Name: name, Token: tok}, n.next(t), "a MinHold release must tell waiters")
	})
	t.Run("ForceRelease", func(t *testing.T) {
		name := "sub:force:" + rand.Text()
		_, n := subscribe(t, st, name)
		take(t, other, name)
		require.NoError(t, other.ForceRelease(ctx, name, 0))
		assert.Equal(t, guard.Notice{Name: name}, n.next(t), "no Guard released it: the notice has no token")
	})
	t.Run("FailedReleaseIsSilent", func(t *testing.T) {
		name, later := "sub:silent:"+rand.Text(), "sub:later:"+rand.Text()
		_, n := subscribe(t, st, name, later)
		take(t, other, name)
		require.ErrorIs(t, other.Release(ctx, name, "not-the-holder", 0), guard.ErrNotHeld)
		tok := take(t, other, later)
		require.NoError(t, other.Release(ctx, later, tok, 0))
		assert.Equal(t, guard.Notice{Name: later, Token: tok}, n.next(t))
		n.none(t)
	})
	t.Run("Unwatch", func(t *testing.T) {
		name, still := "sub:unwatch:"+rand.Text(), "sub:still:"+rand.Text()
		s, n := subscribe(t, st, name, name, still)
		s.Unwatch(name) // watched twice: still watched
		tok := take(t, other, name)
		require.NoError(t, other.Release(ctx, name, tok, 0))
		assert.Equal(t, name, n.next(t).Name)
		s.Unwatch(name)
		tok = take(t, other, name)
		require.NoError(t, other.Release(ctx, name, tok, 0))
		tok = take(t, other, still)
		require.NoError(t, other.Release(ctx, still, tok, 0))
		assert.Equal(t, still, n.next(t).Name)
		n.none(t)
	})
	t.Run("Reconnect", func(t *testing.T) {
		a, b := "sub:a:"+rand.Text(), "sub:b:"+rand.Text()
		s, n := subscribe(t, st, a, b)
		pid := s.pid.Load()
		require.NotZero(t, pid)
		_, err := srv.admin.Exec(ctx, "SELECT pg_terminate_backend($1, 5000)", int64(pid))
		require.NoError(t, err)
		got := map[string]guard.Notice{}
		for range 2 {
			x := n.next(t)
			got[x.Name] = x
		}
		assert.Equal(t, map[string]guard.Notice{a: {Name: a}, b: {Name: b}}, got,
			"after a reconnection, one notice without a token per watched name")
		assert.NotEqual(t, pid, s.pid.Load(), "the same connection")
		tok := take(t, other, a)
		require.NoError(t, other.Release(ctx, a, tok, 0))
		assert.Equal(t, guard.Notice{Name: a, Token: tok}, n.next(t), "not listening again")
	})
	t.Run("Closed", func(t *testing.T) {
		s, err := st.Subscribe(func(guard.Notice) {})
		require.NoError(t, err)
		require.NoError(t, s.Close())
		require.ErrorIs(t, s.Watch(ctx, "x"), ErrSubscriptionClosed)
	})
}

// TestSubscriptionServerDown stops and kills the server under a subscription: Watch waits
// for the LISTEN while it is away, the reader's ping finds a paused server dead, and when the
// server is back every watched name gets a notice.
func TestSubscriptionServerDown(t *testing.T) {
	pg := testserver.StartPostgresServer(t)
	srv := on(t, pg)
	st, _ := srv.store(t)
	st.idleCheck, st.pongTimeout, st.connectTimeout = 100*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond
	name := "down:" + rand.Text()
	s, n := subscribe(t, st, name)

	t.Run("Paused", func(t *testing.T) {
		s.mu.Lock()
		away := s.away
		s.mu.Unlock()
		pg.Pause()
		// The reader's next ping goes unanswered; it gives the connection up and cannot open
		// another: a new Watch waits.
		select {
		case <-away:
		case <-time.After(10 * time.Second):
			t.Fatal("the reader did not notice that the server stopped answering")
		}
		ctx, cancel := contextWithTimeout(t, 300*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, s.Watch(ctx, "other"), ctx.Err(), "Watch returned while nothing listened")
		pg.Resume()
		assert.Equal(t, guard.Notice{Name: name}, n.next(t))
	})
	t.Run("Killed", func(t *testing.T) {
		pg.Kill()
		pg.Restart()
		assert.Equal(t, guard.Notice{Name: name}, n.next(t))
		tok := take(t, st, name)
		require.NoError(t, st.Release(t.Context(), name, tok, 0))
		assert.Equal(t, guard.Notice{Name: name, Token: tok}, n.next(t))
	})
}
