package guard

import (
	"sync"
	"time"
)

// mailbox delivers the events of one lock to the Guard's observer, one at a time and in the
// order they happened, without holding any lock of the Guard while the observer runs. An
// observer may therefore call back into the Guard — release the lock whose loss it hears of,
// for instance — and a slow observer delays only the events of its lock, never a deadline.
//
// Whoever queues an event into an idle mailbox delivers it (and what queues up meanwhile):
// the caller's goroutine for Release and Extend, so that their events are out when they
// return, and a goroutine of its own for the watchdog's events, whose goroutine must not wait
// for user code. EventReleased is the last event a mailbox takes.
type mailbox struct {
	mu     sync.Mutex // protects queue, busy and closed
	queue  []LockEvent
	busy   bool // someone is delivering
	closed bool // EventReleased was queued
	// first backs queue while it is short: most locks see one event (their release), and
	// queuing it must not cost an allocation.
	first [1]LockEvent
}

// event reports e for l to the observer, delivering it on this goroutine unless the lock's
// mailbox is being delivered already.
func (g *Guard) event(l *Lock, e LockEvent) {
	if g.obs != nil && l.events.put(e) {
		g.deliver(l)
	}
}

// eventAsync reports e for l to the observer from a goroutine of its own.
func (g *Guard) eventAsync(l *Lock, e LockEvent) {
	if g.obs != nil && l.events.put(e) {
		g.background(func() { g.deliver(l) })
	}
}

// hold makes the mailbox keep what is queued until deliver is called: a new lock's events
// wait until the observer has seen the end of its acquisition.
func (m *mailbox) hold() { m.busy = true }

// put queues e and reports whether the caller must deliver: the mailbox was idle.
func (m *mailbox) put(e LockEvent) bool {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	if e.Kind == EventReleased {
		m.closed = true
	}
	if m.queue == nil {
		m.queue = m.first[:0]
	}
	m.queue = append(m.queue, e)
	if m.busy {
		return false
	}
	m.busy = true
	return true
}

// deliver hands l's queued events to the observer until none is left.
func (g *Guard) deliver(l *Lock) {
	m := &l.events
	for {
		m.mu.Lock()
		if len(m.queue) == 0 {
			m.busy = false
			m.queue = nil
			m.mu.Unlock()
			return
		}
		e := m.queue[0]
		m.queue = m.queue[1:]
		m.mu.Unlock()
		g.obs.LockEvent(l, e)
	}
}
