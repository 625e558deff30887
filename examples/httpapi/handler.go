package main

// The service: accounts of tenants, with deposit, withdraw and balance over HTTP, every route
// under a distributed read-write lock per account.
//
//	POST /accounts/{id}/deposit   {"amount": 100}   X-Tenant: acme
//	POST /accounts/{id}/withdraw  {"amount": 30}    X-Tenant: acme
//	GET  /accounts/{id}                             X-Tenant: acme
//
// The lock is declared once, on the routes, with middleware.Lock, the template LockTemplate
// ("tenant:{header.X-Tenant}:account:{id}") and middleware.ReadWrite: a deposit or a
// withdrawal (POST) takes the write side and runs alone on its account; balance reads (GET)
// take the read side and run alongside each other, but never while a write of the account is
// between its read and its write — a read answers the balance before a write or after it,
// and one that comes while a write holds the account waits for it. A request waits up to two
// seconds for its side (then gets 423 Locked), and requests on other accounts run in
// parallel. The middleware wraps each route (chi's r.With), not the router: before routing
// there is no {id}. ReadWrite needs a backend that grants shared holds (guard.Sharing): every
// backend the program offers does.
//
// A Store keeps the balances where every instance of the service sees them: RedisStore,
// SQLStore (PostgreSQL, MySQL) and MongoStore on the server the locks are on, Ledger in
// memory for the embedded backend, which is one process. A lock alone does not make a balance
// right across instances: each instance must read what the one before it wrote, so the
// balance lives in the shared database, not in the instance.
//
// Every write carries the fence of the lock it was made under (guard.FromContext), and a
// Store refuses a write whose fence is lower than one it already accepted for that account —
// the write of a holder that paused while its lock expired and someone else took it. The
// Ledger also counts overlapping read-modify-writes of one account, and balance reads made
// while a read-modify-write of the account was open, which the lock must make impossible.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/middleware"
)

// LockTemplate names the lock of the routes: one read-write lock per account of a tenant.
const LockTemplate = "tenant:{header." + TenantHeader + "}:account:{id}"

// TenantHeader is the request header that names the tenant.
const TenantHeader = "X-Tenant"

// DefaultWaitTime is how long a request waits for its account's lock unless WithWaitTime says
// otherwise.
const DefaultWaitTime = 2 * time.Second

// MaxAmount is the largest amount one request moves; MaxBalance the largest balance.
const (
	MaxAmount  = 1_000_000_000_000
	MaxBalance = 1_000_000_000_000_000
)

// ScopeName is the instrumentation scope of the spans the handler starts.
const ScopeName = "guard-httpapi"

// Request is the body of a deposit or a withdrawal: an amount in cents, from 1 to MaxAmount.
type Request struct {
	Amount int64 `json:"amount"`
}

// Balance is the body of every successful response.
type Balance struct {
	Tenant  string `json:"tenant"`
	Account string `json:"account"`
	Balance int64  `json:"balance"`
	// Fence is the fence of the write that the response reports, or for a balance the highest
	// fence the ledger accepted for the account.
	Fence uint64 `json:"fence"`
}

// Option configures NewHandler.
type Option func(*config)

type config struct {
	tp   trace.TracerProvider
	wait time.Duration
	work time.Duration
}

// WithTracerProvider sets the TracerProvider of the request spans and of the ledger spans
// under them. Default: the global one. The Guard's own spans go where its observer sends them.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithWaitTime sets how long a request waits for its side of its account's lock before it is
// answered 423 Locked. Default: DefaultWaitTime; 0 makes one attempt.
func WithWaitTime(d time.Duration) Option {
	return func(c *config) { c.wait = d }
}

// WithWork sets how long each deposit or withdrawal takes between reading the balance and
// writing it back: it stands for the round trips to a real database, the window in which an
// unlocked request on the same account — a write, or a read — would interleave. Default: 0.
func WithWork(d time.Duration) Option {
	return func(c *config) { c.work = d }
}

// NewHandler returns the service's routes, behind a read-write lock per account taken from g;
// store keeps the balances. It panics when g or store is nil, and (in middleware.Lock) when
// g's backend grants no shared holds.
func NewHandler(g *guard.Guard, store Store, opts ...Option) http.Handler {
	if g == nil || store == nil {
		panic("accounts: NewHandler needs a *guard.Guard and a Store")
	}
	c := config{wait: DefaultWaitTime}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	h := &handler{store: store, tracer: c.tp.Tracer(ScopeName), work: c.work}

	r := chi.NewRouter()
	r.Use(serverSpans(h.tracer)) // no lock here: before routing there is no {id}
	// One middleware, so one lock per account: GET takes its read side, POST its write side.
	lock := middleware.Lock(g, LockTemplate, guard.WaitTime(c.wait), middleware.ReadWrite())
	r.With(lock).Get("/accounts/{id}", h.balance)
	r.With(lock).Post("/accounts/{id}/deposit", h.update("accounts.deposit", deposit))
	r.With(lock).Post("/accounts/{id}/withdraw", h.update("accounts.withdraw", withdraw))
	return r
}

type handler struct {
	store  Store
	tracer trace.Tracer
	work   time.Duration
}

// change computes a new balance.
type change func(balance, amount int64) (int64, error)

func deposit(balance, amount int64) (int64, error) {
	if balance > MaxBalance-amount {
		return 0, errBalanceLimit
	}
	return balance + amount, nil
}

func withdraw(balance, amount int64) (int64, error) {
	if amount > balance {
		return 0, ErrInsufficientFunds
	}
	return balance - amount, nil
}

var errBalanceLimit = errors.New("accounts: balance limit")

// balance answers the balance of an account; it runs under the read side of the account's
// lock, so no write of the account is between its read and its write meanwhile.
func (h *handler) balance(w http.ResponseWriter, r *http.Request) {
	a, ok := account(w, r)
	if !ok {
		return
	}
	balance, fence, err := h.store.Balance(r.Context(), a)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "The balance could not be read; try again.")
		return
	}
	reply(w, http.StatusOK, "application/json", Balance{Tenant: a.Tenant, Account: a.ID, Balance: balance, Fence: fence})
}

// update returns the handler of a deposit or a withdrawal, which runs under the write side of
// the account's lock: it writes to the ledger with the lock's fence, in a span called name.
func (h *handler) update(name string, op change) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a, ok := account(w, r)
		if !ok {
			return
		}
		var req Request
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.Amount < 1 || req.Amount > MaxAmount {
			problem(w, http.StatusBadRequest, `The body must be {"amount": n} with n from 1 to 10^12 (cents).`)
			return
		}
		l, held := guard.FromContext(r.Context())
		if !held {
			problem(w, http.StatusInternalServerError, "This route is not behind the lock middleware.")
			return
		}
		ctx, span := h.tracer.Start(r.Context(), name, trace.WithAttributes(
			attribute.Int64("accounts.amount", req.Amount), attribute.Int64("accounts.fence", int64(l.Fence()))))
		defer span.End()

		balance, err := h.store.Update(ctx, a, l.Fence(), func(balance int64) (int64, error) {
			balance, err := op(balance, req.Amount)
			if err != nil {
				return 0, err
			}
			return balance, h.pause(ctx)
		})
		if err != nil {
			span.RecordError(err)
		}
		switch {
		case err == nil:
			reply(w, http.StatusOK, "application/json", Balance{Tenant: a.Tenant, Account: a.ID, Balance: balance, Fence: l.Fence()})
		case errors.Is(err, ErrInsufficientFunds):
			problem(w, http.StatusConflict, "Insufficient funds: the amount is larger than the balance.")
		case errors.Is(err, errBalanceLimit):
			problem(w, http.StatusConflict, "The balance would exceed its limit.")
		case errors.Is(err, ErrStaleFence):
			span.SetStatus(codes.Error, err.Error())
			problem(w, http.StatusConflict, "A newer holder of this account's lock has written it; nothing was written.")
		case errors.Is(err, ErrOutcomeUnknown): // sent, but not answered: perhaps written
			span.SetStatus(codes.Error, err.Error())
			problem(w, http.StatusServiceUnavailable,
				"The write was sent but not answered: its outcome is unknown. Read the balance before you try again.")
		case r.Context().Err() != nil: // the lock was lost, or the client went away, before the write was sent
			span.SetStatus(codes.Error, err.Error())
			problem(w, http.StatusServiceUnavailable, "The request ended before it could write; nothing was written.")
		default: // the store failed
			span.SetStatus(codes.Error, err.Error())
			problem(w, http.StatusServiceUnavailable, "The balance could not be written; try again.")
		}
	}
}

// pause waits for the configured work time: the round trips to a real database, the window
// in which an unlocked request on the same account would interleave. It returns the cause
// when ctx ends first: the lock was lost, or the client left.
func (h *handler) pause(ctx context.Context) error {
	if h.work <= 0 {
		return nil
	}
	t := time.NewTimer(h.work)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// account returns the account a request names, or answers 400 when it names none.
func account(w http.ResponseWriter, r *http.Request) (Account, bool) {
	a := Account{Tenant: r.Header.Get(TenantHeader), ID: accountID(r)}
	if a.Tenant == "" {
		problem(w, http.StatusBadRequest, "The "+TenantHeader+" header is missing.")
		return a, false
	}
	return a, true
}

// accountID returns the {id} of the route, decoded as the lock middleware reads it, so that
// the account written is the account locked: "/accounts/%61" is account "a". chi hands out
// the raw path segment when the path has escapes (it routes on URL.RawPath then).
func accountID(r *http.Request) string {
	id := chi.URLParam(r, "id")
	if r.URL.RawPath != "" {
		if d, err := url.PathUnescape(id); err == nil {
			id = d
		}
	}
	return id
}

// problemBody is an RFC 9457 problem details object.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// problem answers with status and an application/problem+json body.
func problem(w http.ResponseWriter, status int, detail string) {
	reply(w, status, "application/problem+json",
		problemBody{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
}

func reply(w http.ResponseWriter, status int, contentType string, body any) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
