package pgstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/guardlock/guard"
)

// Timings of a subscription's reader.
const (
	// idleCheck is how long the LISTEN connection may stay silent before the reader pings it.
	idleCheck = 5 * time.Second
	// pongTimeout is how long the reader then waits for the answer before it takes the
	// connection for dead and opens another.
	pongTimeout = 5 * time.Second
	// connectTimeout bounds one attempt to open the LISTEN connection.
	connectTimeout = 5 * time.Second
	// retryMin and retryMax bound the pause between failed attempts to connect.
	retryMin = 10 * time.Millisecond
	retryMax = time.Second
)

// Subscribe opens a subscription to releases of the names it watches: one connection taken
// from the pool for the subscription's life (hijacked: the pool neither counts nor closes
// it), which LISTENs on the table's channel — named after the table as the database resolves
// it (sql/channel.sql), so that stores that spell one table differently hear each other — read by one goroutine that calls notify for each
// release of a watched name. Subscribe does no I/O: the goroutine connects in the background,
// and Watch waits until it listens. If the connection breaks (or stops answering the pings
// the reader sends when it has been silent for a while), the reader connects again with
// backoff, listens again, and then calls notify with an empty Token for every watched name,
// because a release may have been missed meanwhile. Subscribe never fails; it returns an
// error to satisfy guard.Notifier.
func (s *Store) Subscribe(notify func(guard.Notice)) (guard.Subscription, error) {
	if notify == nil {
		notify = func(guard.Notice) {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	sub := &subscription{
		store:  s,
		notify: notify,
		cancel: cancel,
		done:   make(chan struct{}),
		names:  make(map[string]int),
		ready:  make(chan struct{}),
		away:   make(chan struct{}),
	}
	close(sub.away)
	go sub.run(ctx)
	return sub, nil
}

// subscription is the guard.Subscription of a Store.
type subscription struct {
	store  *Store
	notify func(guard.Notice)
	cancel context.CancelFunc // stops the reader
	done   chan struct{}      // closed when the reader has returned
	pid    atomic.Uint32      // the listening backend's process id, for tests; 0 when none
	// channel is the channel listened on; the reader's goroutine alone sets and reads it.
	channel string

	mu     sync.Mutex     // protects names, ready, away and closed
	names  map[string]int // watch count per name
	ready  chan struct{}  // closed while the LISTEN is in effect; replaced when it is lost
	away   chan struct{}  // closed while it is not; replaced when it is in effect again
	closed bool
}

// Watch adds name to the watched set and returns once the subscription's LISTEN is in
// effect, so that a release that commits after Watch returns is reported (or, if the
// connection breaks later, followed by a notice when it is back). Watches of a name are
// counted: it stays watched until each successful Watch is matched by an Unwatch. Watch
// returns ErrSubscriptionClosed after Close, or an error matching ctx.Err() when ctx ends
// first.
func (sub *subscription) Watch(ctx context.Context, name string) error {
	sub.mu.Lock()
	if sub.closed {
		sub.mu.Unlock()
		return ErrSubscriptionClosed
	}
	sub.names[name]++
	ready := sub.ready
	sub.mu.Unlock()

	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		sub.Unwatch(name)
		return fmt.Errorf("pgstore: watch: not listening yet: %w", ctx.Err())
	case <-sub.done:
		sub.Unwatch(name)
		return ErrSubscriptionClosed
	}
}

// Unwatch undoes one Watch of name.
func (sub *subscription) Unwatch(name string) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.names[name] <= 1 {
		delete(sub.names, name)
	} else {
		sub.names[name]--
	}
}

// Close ends the subscription: it stops the reader, which closes its connection, and waits
// for it. Pending Watch calls return ErrSubscriptionClosed. It returns nil.
func (sub *subscription) Close() error {
	sub.mu.Lock()
	sub.closed = true
	sub.mu.Unlock()
	sub.cancel()
	<-sub.done
	return nil
}

// run is the reader: it keeps a LISTEN connection open until ctx ends.
func (sub *subscription) run(ctx context.Context) {
	defer close(sub.done)
	backoff := retryMin
	for first := true; ; first = false {
		conn, err := sub.connect(ctx)
		for err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, retryMax)
			conn, err = sub.connect(ctx)
		}
		backoff = retryMin
		sub.pid.Store(conn.PgConn().PID())

		names := sub.listening()
		if !first {
			// Releases while we were away went unheard: let every waiter look again.
			for _, name := range names {
				sub.notify(guard.Notice{Name: name})
			}
		}
		sub.read(ctx, conn)

		sub.pid.Store(0)
		sub.lost()
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

// connect takes a connection out of the pool for good, asks for the table's channel and
// LISTENs on it.
func (sub *subscription) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, sub.store.connectTimeout)
	defer cancel()
	pc, err := sub.store.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	err = conn.QueryRow(ctx, sub.store.sql.channel).Scan(&sub.channel)
	if err == nil {
		_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{sub.channel}.Sanitize())
	}
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// listening marks the LISTEN in effect, releasing waiting Watch calls, and returns the
// watched names.
func (sub *subscription) listening() []string {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	close(sub.ready)
	sub.away = make(chan struct{})
	names := make([]string, 0, len(sub.names))
	for name := range sub.names {
		names = append(names, name)
	}
	return names
}

// lost marks the LISTEN no longer in effect: Watch calls wait for the next one.
func (sub *subscription) lost() {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	sub.ready = make(chan struct{})
	close(sub.away)
}

// read delivers the notifications that arrive on conn until ctx ends or conn fails. After
// idleCheck without one, it pings the server, and gives the connection up when the answer
// takes longer than pongTimeout.
func (sub *subscription) read(ctx context.Context, conn *pgx.Conn) {
	for {
		wctx, cancel := context.WithTimeout(ctx, sub.store.idleCheck)
		n, err := conn.WaitForNotification(wctx)
		idle := wctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			sub.deliver(n.Channel, n.Payload)
			continue
		case !idle || conn.IsClosed():
			return
		}
		pctx, cancel := context.WithTimeout(ctx, sub.store.pongTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			return
		}
	}
}

// deliver calls notify for a release, or a hand-over, of a watched name.
func (sub *subscription) deliver(channel, payload string) {
	if channel != sub.channel {
		return
	}
	n, ok := parseNotice(payload)
	if !ok {
		return
	}
	sub.mu.Lock()
	_, watched := sub.names[n.Name]
	sub.mu.Unlock()
	if watched {
		sub.notify(n)
	}
}
