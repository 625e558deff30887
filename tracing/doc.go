// Package tracing reports the whole life of the locks of a guard.Guard to OpenTelemetry:
// spans for waiting, for the locked section and for the release, span events for renewals and
// loss, and metrics. One line sets it up:
//
//	g := guard.New(backend, guard.WithObserver(tracing.New()))
//
// The package imports the OpenTelemetry API only. It uses the global TracerProvider and
// MeterProvider unless WithTracerProvider or WithMeterProvider says otherwise; without an SDK
// installed every call is a no-op.
//
// # Spans
//
// Span names are low-cardinality: they carry the acquisition's label (guard.Label; decorators
// and middleware set it to their template), never the rendered lock name. Without a label the
// names are the fixed "guard.acquire", "guard.hold" and "guard.release".
//
//   - "guard.acquire <label>" covers one acquisition, from the first attempt until it ended. It
//     is a child of the caller's span and is recorded for every acquisition, whatever its
//     outcome, not only for those that waited: the attributes say how it went (OutcomeKey,
//     WaitKey, AttemptsKey, WakeupsKey, FenceKey when acquired, MaxWaitKey when bounded, and
//     LabelKey, BackendKey, KindKey, PermitsKey for a permit, NameKey). Its status is Error only when the outcome is
//     guard.OutcomeError (a backend failure, or a closed Guard). A busy lock, a wait that ran
//     out and a wait that the caller cancelled are what a lock is for; they leave the status
//     unset and show in the outcome attribute.
//   - "guard.hold <label>" covers the locked section, from the moment the lock was granted
//     until it was released. It is a child of the caller's span (a sibling of the acquire
//     span), and it is the parent of everything that runs under the Lock's context: the body
//     of guard.Guard.Do, a decorated function, a handler behind the middleware. Renewals
//     ("guard.lock.renewed"), renewal failures ("guard.lock.renew_failed"), lease extensions
//     ("guard.lock.extended"), loss ("guard.lock.lost") and the end of a lease
//     ("guard.lock.lease_expired") are events on it; loss and lease end also set its status to
//     Error with the cause. When the caller had no span, the hold span starts a trace of its
//     own, linked to the acquire span.
//   - "guard.release <label>" is a child of the hold span and covers the backend's release
//     call. Its status is Error when the release failed (the lock was no longer ours, or the
//     backend did not answer).
//
// # Metrics
//
// All metrics carry LabelKey (when a label was given), BackendKey and KindKey (PermitsKey too
// for a semaphore's permits); never the lock name.
//
//   - guard.lock.wait.duration (histogram, s): how long each acquisition took, with OutcomeKey.
//   - guard.lock.hold.duration (histogram, s): how long each lock was held, recorded at release.
//   - guard.lock.acquisitions (counter): acquisitions, with OutcomeKey.
//   - guard.lock.renewal.failures (counter): watchdog renewals that failed for now.
//   - guard.lock.losses (counter): locks lost or whose lease ran out, with ReasonKey.
//   - guard.lock.held (up-down counter): locks held right now: up when granted, down when lost,
//     when their lease ran out, or when released, whichever comes first.
//   - guard.lock.permits.used (up-down counter): semaphore permits held right now, as held
//     counts them, with PermitsKey: divide by it for a semaphore's use.
//   - guard.lock.readers (up-down counter): read locks of read-write locks held right now.
//   - guard.lock.writer.wait.duration (histogram, s): how long each write-lock acquisition
//     took, with OutcomeKey: what readers cost a writer.
//   - guard.lock.terms (counter): election terms begun on this instance.
//
// # Lock names
//
// Lock names are rendered from call arguments and requests, so they can carry user data: an
// account number, a tenant, an e-mail address. By default the spans record them as they are
// (NameRaw), as HTTP instrumentation records URL paths: the name is what someone debugging a
// stuck lock needs. WithNames(NameHashed) records a short stable hash instead, which still
// correlates the spans of one name across instances; WithNames(NameDropped) leaves the name
// out. A hash of a low-entropy value (an account number) can be reversed by trying every
// value: when names hold data that must not reach the tracing backend, drop them.
//
// Under NameHashed and NameDropped the name is kept out of error text too: guard's errors
// quote it (a failed acquire or release, a NameError), and so do some drivers', so the span
// status, the exception events' messages and the error.message of events carry the error's
// text with the name replaced by "#" and its hash, or by "#redacted" — wherever it stands
// quoted, cut to a NameError's 64 characters, or bare between characters that are not letters
// or digits. Metrics never carry names or error text.
package tracing
