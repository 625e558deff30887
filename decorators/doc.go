// Package decorators wraps functions so that each call runs under a distributed lock whose
// name is rendered from the call's argument: the lock is declared once, where the function is
// built, like an annotation.
//
//	withdraw := decorators.MustFunc(g, "account:{AccountID}", svc.Withdraw)
//	receipt, err := withdraw(ctx, req) // req.AccountID names the lock
//
// There is one generic shape, func(context.Context, A) (R, error) — Func and MustFunc — and one
// for worker functions with a fixed lock name, func(context.Context) error — Job and MustJob.
// Pack several arguments in a struct to use more than one. FuncAll and MustFuncAll lock several
// names rendered from one argument.
//
// # Templates
//
// A template is literal text with placeholders in braces. A placeholder is a field path into
// the argument: "orders:{ID}", "tenant:{Tenant.ID}:import:{Kind}". Exported struct fields are
// followed by name (promoted fields of embedded structs too), pointers are followed, and a map
// with string keys is indexed by the path element ("{Labels.region}"). "{.}" is the argument
// itself, for a scalar argument: decorators.Func[string, …](g, "user:{.}", fn). In literal text
// "{{" and "}}" stand for braces.
//
// The template is checked when the decorator is built, against the argument type A: bad
// syntax, a field A does not have, an unexported field, or a type that cannot be formatted is
// an error there (Func, Job) or a panic (MustFunc, MustJob), never a surprise on a call.
//
// A value is formatted by its type: MarshalText when the type (or its pointer) implements
// encoding.TextMarshaler (time.Time, UUID types, net/netip addresses); otherwise by kind —
// strings as they are, integers in decimal, floats and complex numbers in the shortest form
// that reads back exactly, bools as true/false, []byte as its bytes; otherwise String when the
// type implements fmt.Stringer. Structs, slices, maps and interfaces without those methods are
// rejected at construction: name one of their fields instead.
//
// Values are escaped so that rendering is injective: with "{A}:{B}", (A "x:y", B "z") and
// (A "x", B "y:z") get different names, and templates with different separators never share
// a name. A call whose value is empty, or reached through a nil pointer (one held in an
// interface field too) or a missing map key, fails with a *guard.NameError and does not run
// the function; so does a value whose IsZero method reports true (the zero time.Time), a
// MarshalText, String or IsZero method that panics, and a rendered name longer than
// guard.MaxNameLen (names are never cut). Zero numbers and false are values. The escaping rules,
// and why zero numbers are kept, are in the [templates guide].
//
// # Calls
//
// A decorated call tries once by default: when another holder has the lock it returns an
// error matching guard.ErrNotAcquired (a *guard.BusyError) without running the function.
// Pass guard.WaitTime(d) to wait up to d. Other guard.LockOptions (LeaseTime, MinHold) apply
// to every call; the decorator adds guard.Label(template) so that telemetry is named by the
// template, not by the rendered name.
//
// The function runs under the lock's context: guard.FromContext gives the Lock (and its
// fence), and the context is cancelled with cause guard.ErrLockLost or guard.ErrLeaseExpired
// when the lock is lost. A decorated call made under that context on the same name (a nested
// or recursive call) re-enters the lock instead of waiting for itself. The lock is released
// when the function returns or panics (the panic goes on), with a context that ignores the
// caller's cancellation. What a call returns after the function ran is what guard.Guard.Do
// returns: when the lock was lost while the function ran, or found gone at release, the error
// matches guard.ErrLockLost or guard.ErrLeaseExpired even if the function returned nil; a
// release that fails for another reason (the backend went away) is not returned, since the
// work is done, and the observer hears of it. The [semantics guide] ("Cancellation and
// release") says why.
//
// # Permits, readers and writers, several names
//
// By default a call holds the rendered name's lock: one call per name at a time. Options of
// this package choose another of guard's primitives on the same name, in the same option list:
//
//	importTenant := decorators.MustFunc(g, "tenant:{Tenant}:import", svc.Import,
//		decorators.Permits(3)) // up to 3 imports per tenant at once
//	getDoc := decorators.MustFunc(g, "doc:{.}", svc.Get, decorators.Read())
//	putDoc := decorators.MustFunc(g, "doc:{ID}", svc.Put, decorators.Write())
//
// Permits(n) holds one of n permits of a guard.Semaphore; Read and Write hold a side of a
// guard.RWMutex — readers together, a writer alone. Each needs a backend with shared holds
// (guard.Sharing): Func and Job refuse them otherwise. FuncAll takes several templated names,
// all or none, in one canonical order (guard.Guard.AcquireAll):
//
//	transfer := decorators.MustFuncAll(g, []string{"account:{From}", "account:{To}"}, svc.Transfer)
//
// A busy call returns a *guard.BusyError whose Kind says what it asked for: guard.KindPermit
// when every permit was taken (an HTTP service answers 429 Too Many Requests), guard.KindRead
// or guard.KindWrite for a side, guard.KindMutex for a lock (423 Locked). The [primitives
// guide] says which primitive fits which job, and what each guarantees.
//
// # Scheduled jobs and batches
//
// A job that every instance of a service runs on the same schedule runs once per tick when
// it is decorated with guard.MinHold(d): the first instance takes the lock, and the lock
// outlives a fast job for d, so the other instances, whose timers fire a little later or whose
// clocks are skewed, find it busy. Make d half the schedule's period (the [scheduling guide]
// has the rule, and adapters for gocron and robfig/cron: packages gocronlock and cronlock). A
// batch whose items each take their own lock ("task:{ID}") is processed once per item across
// instances.
//
// [templates guide]: https://github.com/guardlock/guard/blob/main/docs/templates.md
// [semantics guide]: https://github.com/guardlock/guard/blob/main/docs/semantics.md
// [scheduling guide]: https://github.com/guardlock/guard/blob/main/docs/scheduling.md
// [primitives guide]: https://github.com/guardlock/guard/blob/main/docs/primitives.md
package decorators
