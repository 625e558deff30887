package redisstore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
)

// Timings of the subscription's reader.
const (
	// idleCheck is how long the PubSub connection may stay silent before the reader pings it.
	idleCheck = 5 * time.Second
	// pongTimeout is how long the reader then waits for any reply before it takes the
	// connection for dead and has go-redis open a new one.
	pongTimeout = 5 * time.Second
	// retryMin and retryMax bound the pause between failed reads while the server is away.
	retryMin = 10 * time.Millisecond
	retryMax = time.Second
)

// Subscribe opens one go-redis PubSub, read by one goroutine, for release notifications of
// the names the returned Subscription watches; it calls notify for each release (or MinHold
// keep, or forced release) of a watched lock that someone waits for, with the released token
// and, after a hand-over, the waiter that holds the lock now and its fence. The reader opens the
// connection in the background and keeps it open (reconnecting when it breaks) until Close.
// After a reconnection it confirms that every channel is subscribed again and then sends one
// notice with an empty token per watched name: a release may have been published while it was
// away. Subscribe never fails; it returns an error to satisfy guard.Notifier.
//
// The Subscription counts Watch and Unwatch calls per name: a name stays watched until every
// successful Watch of it has been matched by an Unwatch.
func (s *Store) Subscribe(notify func(guard.Notice)) (guard.Subscription, error) {
	released := notify
	if released == nil {
		released = func(guard.Notice) {}
	}
	sub := &subscription{
		store:    s,
		ps:       s.client.Subscribe(context.Background()),
		released: released,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		refs:     make(map[string]int),
		barriers: make(map[string]chan struct{}),
		reset:    make(chan struct{}),
	}
	s.subsMu.Lock()
	s.subs[sub] = struct{}{}
	s.subsMu.Unlock()
	go sub.read()
	return sub, nil
}

// handedOver tells the Store's own subscriptions that watch n.Name of a hand-over by one of
// its releases, without waiting for the pub/sub message, which follows; a Guard takes the
// second notice of one hand-over for nothing.
func (s *Store) handedOver(n guard.Notice) {
	s.subsMu.Lock()
	var notify []func(guard.Notice)
	for sub := range s.subs {
		if sub.watches(n.Name) {
			notify = append(notify, sub.released)
		}
	}
	s.subsMu.Unlock()
	for _, f := range notify {
		f(n)
	}
}

// subscription is the guard.Subscription of a Store.
//
// Watch confirms a subscription with a barrier: after SUBSCRIBE it sends PING with a payload
// of its own on the same connection and waits for that pong. Redis answers the commands of a
// connection in order, so the pong means the SUBSCRIBE was applied (or, after a reconnect,
// that go-redis subscribed again: it resubscribes before it sends anything else). A
// "subscribe" confirmation could not tell a current SUBSCRIBE from an earlier one that an
// UNSUBSCRIBE has since undone.
type subscription struct {
	store    *Store
	ps       *redis.PubSub
	released func(guard.Notice)

	stop      chan struct{} // closed by Close: ends the reader and pending Watch calls
	done      chan struct{} // closed when the reader has returned
	closeOnce sync.Once
	closeErr  error

	// subMu protects refs, and orders SUBSCRIBE and UNSUBSCRIBE of a channel on the wire
	// with the changes of its count: it is held while they are sent.
	subMu sync.Mutex
	refs  map[string]int // watch count per channel

	// mu protects seq, barriers and reset.
	mu       sync.Mutex
	seq      uint64
	barriers map[string]chan struct{} // by PING payload; closed when its pong arrives
	reset    chan struct{}            // closed (and replaced) when the connection failed
}

// Watch subscribes to name's release channel and returns once the server has applied the
// subscription, so that a release after Watch returns is reported. It returns
// ErrSubscriptionClosed after Close, an error that matches ctx.Err() when ctx ends first, or
// a backend error that wraps the driver's error.
func (s *subscription) Watch(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ch := s.store.channel(name)
	err := s.subscribe(ctx, ch)
	if err == nil {
		if err = s.confirm(ctx); err != nil {
			s.unsubscribe(ch)
		}
	}
	if err != nil && s.closed() {
		err = ErrSubscriptionClosed // whatever go-redis said about its closed PubSub
	}
	return err
}

// watches reports whether name is watched.
func (s *subscription) watches(name string) bool {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	return s.refs[s.store.channel(name)] > 0
}

// Unwatch undoes one Watch of name; the channel is unsubscribed when no Watch of it is left.
func (s *subscription) Unwatch(name string) { s.unsubscribe(s.store.channel(name)) }

// Close ends the subscription: it closes the PubSub connection and waits for the reader
// goroutine to return. Pending Watch calls return ErrSubscriptionClosed. Calling Close again
// returns the first call's result.
func (s *subscription) Close() error {
	s.closeOnce.Do(func() {
		s.store.subsMu.Lock()
		delete(s.store.subs, s)
		s.store.subsMu.Unlock()
		close(s.stop)
		if err := s.ps.Close(); err != nil {
			s.closeErr = err
		}
		<-s.done
	})
	return s.closeErr
}

// closed reports whether Close was called.
func (s *subscription) closed() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// subscribe counts one more watch of ch, and sends SUBSCRIBE for the first.
func (s *subscription) subscribe(ctx context.Context, ch string) error {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if s.closed() {
		return ErrSubscriptionClosed
	}
	s.refs[ch]++
	if s.refs[ch] > 1 {
		return nil
	}
	if err := s.ps.Subscribe(ctx, ch); err != nil {
		delete(s.refs, ch)
		// go-redis remembers the channel even when sending failed, to subscribe again after a
		// reconnect; take it back.
		_ = s.ps.Unsubscribe(context.WithoutCancel(ctx), ch)
		return err
	}
	return nil
}

// unsubscribe counts one watch of ch less, and sends UNSUBSCRIBE after the last.
func (s *subscription) unsubscribe(ch string) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	switch n := s.refs[ch]; {
	case n == 0:
		return
	case n > 1:
		s.refs[ch] = n - 1
		return
	}
	delete(s.refs, ch)
	if !s.closed() {
		// A failure leaves an extra subscription at worst: notifications for a name nobody
		// waits for, until the connection is replaced.
		_ = s.ps.Unsubscribe(context.Background(), ch)
	}
}

// confirm sends a PING barrier after the caller's SUBSCRIBE and waits for its pong, sending
// a new one each time the connection fails before the pong arrives.
func (s *subscription) confirm(ctx context.Context) error {
	for {
		token, pong, reset := s.barrier()
		if err := s.ps.Ping(ctx, token); err != nil {
			s.dropBarrier(token)
			return err
		}
		select {
		case <-pong:
			return nil
		case <-reset:
			s.dropBarrier(token)
		case <-ctx.Done():
			s.dropBarrier(token)
			return ctx.Err()
		case <-s.stop:
			return ErrSubscriptionClosed
		}
	}
}

// barrier registers a new PING payload and returns it with the channel that its pong closes
// and the channel that a connection failure closes.
func (s *subscription) barrier() (token string, pong, reset <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	token = "guard-watch-" + strconv.FormatUint(s.seq, 10)
	c := make(chan struct{})
	s.barriers[token] = c
	return token, c, s.reset
}

func (s *subscription) dropBarrier(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.barriers, token)
}

// ponged releases the Watch waiting for the pong of token, if any.
func (s *subscription) ponged(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.barriers[token]; ok {
		close(c)
		delete(s.barriers, token)
	}
}

// connectionFailed tells every pending Watch that its PING may have been lost.
func (s *subscription) connectionFailed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.reset)
	s.reset = make(chan struct{})
}

// read is the one goroutine that receives from the PubSub connection, until Close. It hands
// released names to the callback and pongs to Watch, checks that a silent connection is still
// alive, and after a reconnection announces every watched name once the server confirms the
// channels are subscribed again.
func (s *subscription) read() {
	defer close(s.done)
	ctx := context.Background()
	pinged := false // a health-check PING is unanswered
	pause := retryMin
	timer := time.NewTimer(0)
	<-timer.C
	missed := false // the connection failed: releases may have gone unheard
	resync := ""    // payload of the PING that confirms the channels after a reconnection
	for {
		if missed && resync == "" {
			// go-redis opens a new connection for this PING and subscribes every channel
			// again before it: its pong means they are all in place.
			token, _, _ := s.barrier()
			s.dropBarrier(token)
			if s.ps.Ping(ctx, token) == nil {
				resync, missed = token, false
			}
		}
		var msg any
		var err error
		if pinged {
			// A context deadline (unlike ReceiveTimeout's) makes go-redis count a timeout as
			// a broken connection and replace it, subscribing again.
			rctx, cancel := context.WithTimeout(ctx, s.store.pongTimeout)
			msg, err = s.ps.Receive(rctx)
			cancel()
		} else {
			msg, err = s.ps.ReceiveTimeout(ctx, s.store.idleCheck)
		}
		if err != nil {
			if s.closed() {
				return
			}
			if !pinged && isTimeout(err) {
				// Silent for idleCheck: ask the server for a sign of life.
				if s.ps.Ping(ctx) == nil {
					pinged = true
					continue
				}
			}
			pinged, missed, resync = false, true, ""
			s.connectionFailed()
			timer.Reset(pause)
			select {
			case <-s.stop:
				timer.Stop()
				return
			case <-timer.C:
			}
			pause = min(2*pause, retryMax)
			continue
		}
		pinged, pause = false, retryMin
		switch m := msg.(type) {
		case *redis.Message:
			if name, ok := s.store.nameOf(m.Channel); ok {
				s.released(notice(name, m.Payload))
			}
		case *redis.Pong:
			if resync != "" && m.Payload == resync {
				resync = ""
				s.announceAll()
			} else {
				s.ponged(m.Payload)
			}
		}
	}
}

// notice reads a release's payload: the released token, or, after a hand-over,
// "released\nnext\nfence\nlease\nattempt" (see lock.lua).
func notice(name, payload string) guard.Notice {
	token, rest, handed := strings.Cut(payload, "\n")
	n := guard.Notice{Name: name, Token: token}
	if handed {
		next, rest, _ := strings.Cut(rest, "\n")
		fence, rest, _ := strings.Cut(rest, "\n")
		lease, attempt, _ := strings.Cut(rest, "\n")
		if f, err := strconv.ParseUint(fence, 10, 64); err == nil && next != "" {
			n.Next, n.Fence = next, f
			if ms, err := strconv.ParseInt(lease, 10, 64); err == nil && ms > 0 {
				n.Lease = time.Duration(ms) * time.Millisecond
			}
			if a, err := strconv.Atoi(attempt); err == nil {
				n.Attempt = a
			}
		}
	}
	return n
}

// announceAll sends a notice without a token for every watched name.
func (s *subscription) announceAll() {
	s.subMu.Lock()
	names := make([]string, 0, len(s.refs))
	for ch := range s.refs {
		if name, ok := s.store.nameOf(ch); ok {
			names = append(names, name)
		}
	}
	s.subMu.Unlock()
	for _, name := range names {
		s.released(guard.Notice{Name: name})
	}
}

// isTimeout reports whether err is a read that timed out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
