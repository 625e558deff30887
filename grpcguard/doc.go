// Package grpcguard locks gRPC calls: server interceptors that hold a distributed lock,
// named from the call's request message, metadata or peer, while the handler runs — the
// annotation style of package middleware, for gRPC services.
//
//	locks, err := grpcguard.New(g,
//		grpcguard.Method("/bank.v1.Accounts/Withdraw", "account:{account_id}", guard.WaitTime(2*time.Second)),
//		grpcguard.Method("/bank.v1.Accounts/Import", "import:{md.x-tenant}", grpcguard.Permits(3)),
//	)
//	if err != nil {
//		return err // a rule that does not fit its method: *grpcguard.RuleError
//	}
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(locks.Unary()),
//		grpc.ChainStreamInterceptor(locks.Stream()),
//	)
//
// The package is a module of its own (github.com/guardlock/guard/grpcguard), so that gRPC
// stays out of the builds of guard's other users.
//
// # Rules and templates
//
// A rule names a method by its full name and gives the template of its lock, in the language
// of the decorators and the middleware: literal text with placeholders, rendered so that one
// resource has one name and two resources two names (the [templates guide] has the rules).
// A placeholder is
//
//	{account_id}         a field of the request message, by its proto name
//	{order.customer_id}  a field of a message field, to any depth
//	{md.x-tenant}        the one value of an incoming metadata key (lower case; not grpc-*
//	                     or te, which gRPC keeps to itself)
//	{peer}               the caller's authenticated identity (see Identity)
//
// New checks every rule against its method's descriptor — from protoregistry.GlobalFiles,
// where generated code registers its files, or from Files — and refuses, with a *RuleError
// that names the method, the template and the reason: a method that does not exist, a field
// the request message does not have (with its proto name when a JSON name was written), a
// repeated or map field (one call would name several resources), a float or double (no exact
// name), a message other than a wrapper of google/protobuf/wrappers.proto (name one of its
// fields), bad syntax, and bad options. Nothing is found out on the first call.
//
// Values render by kind: strings as they are (two Unicode spellings of one text, NFC and NFD,
// are two values), integers in decimal, bools as true and false, enums by their number — as on
// the wire, so that servers built from two versions of the schema, one of which renamed or
// added a value, name one resource alike — bytes in unpadded URL-safe base64, a wrapper by its
// value. A field that is not set — a message field, a field with explicit presence (proto3
// optional, proto2), or a plain proto3 scalar holding its default (0, "", false, the enum's
// zero value: proto3 cannot tell them from a field the client forgot) — fails the call with
// InvalidArgument, and the handler does not run; so does an empty string or bytes value,
// wherever it is. A number or bool with explicit presence, or in a wrapper, holds zero as a
// value.
//
// # Streams
//
// A stream's lock is held for the whole stream, from before the handler runs to its return.
// Its messages are not known when the stream opens, so a streaming method's template may
// name only metadata and the peer; New refuses a field. The handler's stream has the lock's
// context. When the lock is lost, the call ends at once with Aborted — a handler blocked in
// RecvMsg or SendMsg, which follow the call and not the lock, would otherwise hold it open —
// and the handler's next read or write fails; the lock is given back when the handler
// returns.
//
// New cannot see the server: a rule for a method that the server never registers does
// nothing. Interceptors.Check reports such rules once the services are registered.
//
// # Calls and status codes
//
// A call tries once by default; guard.WaitTime(d) makes it wait up to d. The other
// guard.LockOptions (LeaseTime, MinHold, NoReentry) apply to every call of the rule, and the
// rule adds guard.Label(template), so that telemetry is named by the template. Permits(n)
// admits n calls at a time per name.
//
// The handler runs under the lock's context: guard.FromContext gives the Lock and its fence,
// to pass on to the resource; the context ends, with cause guard.ErrLockLost or
// guard.ErrLeaseExpired, when the lock is lost. Tracing needs nothing more: guard's spans start
// from the call's context, so under otelgrpc's stats handler they nest in its server span.
//
// The codes follow gRPC's guide to status codes:
//
//   - Aborted when another call holds the lock — a concurrency conflict the client may retry —
//     and ResourceExhausted when every permit is taken (Permits), as HTTP has 423 and 429.
//     Both carry a google.rpc.RetryInfo detail with the holder's remaining lease, when the
//     backend reported it: an upper bound, which for a lock the watchdog renews is its whole
//     TTL. RetryBusy, the client interceptor, waits for it up to a maximum.
//   - InvalidArgument when a value the name needs is missing or empty, or two metadata values
//     compete for one placeholder; Unauthenticated when "{peer}" finds no identity.
//   - Aborted when the lock was lost while the handler ran, whatever the handler returned:
//     the call may not have run alone, nor to its end.
//   - Unavailable when the lock's backend cannot be reached (or the Guard is closed): the
//     code retry policies retry.
//   - Canceled or DeadlineExceeded when the call's own context ended while it waited.
//
// Otherwise the call returns what its handler returned. Statuses carry the template, never the
// call's values.
//
// A method without a rule goes straight to its handler: the interceptors cost it a map lookup
// and no allocation.
//
// [templates guide]: https://github.com/guardlock/guard/blob/main/docs/templates.md
package grpcguard
