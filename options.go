package guard

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// DefaultWatchdogTimeout is the lease of a lock taken without LeaseTime; the watchdog renews
// it every third of that.
const DefaultWatchdogTimeout = 30 * time.Second

// minTTL is the shortest lease a Guard accepts: shorter leases cannot be renewed in time
// over a real network.
const minTTL = 10 * time.Millisecond

// Option configures a Guard. Pass options to New.
type Option func(*settings)

// settings is what Options set on a Guard.
type settings struct {
	watchdogTimeout time.Duration
	observer        Observer
	instance        string
	err             error // first invalid option
}

// WithWatchdogTimeout sets the lease of locks taken without LeaseTime; the watchdog renews
// them every d/3 until they are released. Default: DefaultWatchdogTimeout (30 s). d must be at
// least 10 ms.
func WithWatchdogTimeout(d time.Duration) Option {
	return func(s *settings) {
		if d < minTTL {
			s.fail(&OptionError{Option: "WithWatchdogTimeout", Value: d, Reason: "must be at least 10ms"})
			return
		}
		s.watchdogTimeout = d
	}
}

// WithObserver makes the Guard report every lock lifecycle event to o (package tracing
// provides an OpenTelemetry observer). Default: none, at no cost.
func WithObserver(o Observer) Option {
	return func(s *settings) { s.observer = o }
}

// WithInstance names this process in the locks it takes, for operators who ask who holds a
// lock (Inspector, cmd/guardctl): a pod name, a service instance id. Default: the host name
// and process id, as "host:pid". id must not be empty or longer than 256 bytes.
func WithInstance(id string) Option {
	return func(s *settings) {
		if id == "" || len(id) > maxInstanceLen {
			s.fail(&OptionError{Option: "WithInstance", Value: id, Reason: fmt.Sprintf("must be 1 to %d bytes", maxInstanceLen)})
			return
		}
		s.instance = id
	}
}

const maxInstanceLen = 256

// defaultInstance returns "host:pid".
func defaultInstance() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

func (s *settings) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// LockOption configures one acquisition: Acquire, TryAcquire, Do, and the decorators and
// middleware built on them. Packages built on guard define options of their own that travel in
// the same list by embedding EmptyLockOption; a Guard ignores those.
type LockOption interface {
	applyLock(*lockSettings)
}

// EmptyLockOption is a LockOption that does nothing to an acquisition. Embed it in the option
// types of a package built on guard (a decorator, a middleware) so that its options can be
// passed in one list with the core's.
type EmptyLockOption struct{}

func (EmptyLockOption) applyLock(*lockSettings) {}

// lockSettings is what LockOptions set on one acquisition.
type lockSettings struct {
	leaseTime time.Duration // 0: watchdog mode
	waitTime  time.Duration // <0: until ctx is done; 0: one attempt
	minHold   time.Duration
	label     string
	noReentry bool
	// Set by the primitives, not by options of their own: what is asked for.
	kind  Kind
	limit int    // a shared hold's limit (Request.Limit)
	value string // Request.Value
	err   error
}

type lockOptionFunc func(*lockSettings)

func (f lockOptionFunc) applyLock(s *lockSettings) { f(s) }

// LeaseTime gives the lock a fixed lease of d: it is not renewed, and its context is cancelled
// with ErrLeaseExpired when the lease runs out (Lock.Extend can push it back). Default: no
// lease time — the watchdog holds the lock until it is released. d must be at least 10 ms.
func LeaseTime(d time.Duration) LockOption {
	return lockOptionFunc(func(s *lockSettings) {
		if d < minTTL {
			s.fail(&OptionError{Option: "LeaseTime", Value: d, Reason: "must be at least 10ms"})
			return
		}
		s.leaseTime = d
	})
}

// WaitTime bounds how long an acquisition waits for a busy lock: 0 makes one attempt, d > 0
// waits up to d. Default: Acquire waits until its context is done; TryAcquire, decorators and
// middleware make one attempt. d must not be negative.
func WaitTime(d time.Duration) LockOption {
	return lockOptionFunc(func(s *lockSettings) {
		if d < 0 {
			s.fail(&OptionError{Option: "WaitTime", Value: d, Reason: "must not be negative"})
			return
		}
		s.waitTime = d
	})
}

// MinHold keeps the name locked for at least d after it was acquired, even when the lock is
// released sooner (ShedLock's lockAtLeastFor): Release then shortens the lease to what is left
// of the window instead of freeing the name. A job that finishes fast then still runs once per
// window across instances, even with skewed clocks. Default: 0. d must not be negative, and
// not longer than LeaseTime when both are given.
func MinHold(d time.Duration) LockOption {
	return lockOptionFunc(func(s *lockSettings) {
		if d < 0 {
			s.fail(&OptionError{Option: "MinHold", Value: d, Reason: "must not be negative"})
			return
		}
		s.minHold = d
	})
}

// Label gives the acquisition a low-cardinality name for telemetry, such as the template the
// lock name was rendered from. Default: "" (observers then use a fixed span name). Decorators
// and middleware set it to their template.
func Label(label string) LockOption {
	return lockOptionFunc(func(s *lockSettings) { s.label = label })
}

// NoReentry makes the acquisition ask the backend even when its context runs under a lock of
// the same Guard on the same name, instead of re-entering that lock: for work that fans out
// under the lock's context (an errgroup) and must take the lock again in each goroutine. It
// then waits for the outer lock like any other caller. Default: re-enter.
func NoReentry() LockOption {
	return lockOptionFunc(func(s *lockSettings) { s.noReentry = true })
}

// kindOf sets what a primitive asks for: its kind, the limit of a shared hold, its value.
func kindOf(kind Kind, limit int, value string) LockOption {
	return lockOptionFunc(func(s *lockSettings) { s.kind, s.limit, s.value = kind, limit, value })
}

// withKind returns opts followed by kind in a slice of its own: callers may share one slice
// of options, with room to spare, among goroutines, and an append into that room would hand
// one acquisition another's kind.
func withKind(opts []LockOption, kind LockOption) []LockOption {
	return append(opts[:len(opts):len(opts)], kind)
}

func (s *lockSettings) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// resolve applies opts over the defaults: wait until ctx is done unless WaitTime says otherwise.
func resolve(defaultWait time.Duration, opts []LockOption) (lockSettings, error) {
	var s lockSettings
	err := s.resolve(defaultWait, opts)
	return s, err
}

// resolve sets s from the defaults and opts. It is a method, so that a caller whose settings
// live in a struct on the heap already (an acquisition's) does not pay for another.
func (s *lockSettings) resolve(defaultWait time.Duration, opts []LockOption) error {
	*s = lockSettings{waitTime: defaultWait}
	for _, o := range opts {
		if o == nil {
			continue
		}
		o.applyLock(s)
	}
	if s.err != nil {
		return s.err
	}
	if s.leaseTime > 0 && s.minHold > s.leaseTime {
		return &OptionError{Option: "MinHold", Value: s.minHold,
			Reason: fmt.Sprintf("longer than LeaseTime(%v)", s.leaseTime)}
	}
	return nil
}

// CheckLockOptions reports the first invalid option in opts, as Acquire would. Decorators and
// middleware call it at construction so that a bad option fails there, not on a request.
func CheckLockOptions(opts ...LockOption) error {
	_, err := resolve(-1, opts)
	return err
}
