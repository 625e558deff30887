package accounts

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

// LockTemplate names the lock of the mutating routes: one lock per account of a tenant.
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
const ScopeName = "github.com/guardlock/guard/examples/httpapi/accounts"

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

// WithWaitTime sets how long a request waits for its account's lock before it is answered 423
// Locked. Default: DefaultWaitTime; 0 makes one attempt.
func WithWaitTime(d time.Duration) Option {
	return func(c *config) { c.wait = d }
}

// WithWork sets how long each deposit or withdrawal takes between reading the balance and
// writing it back: it stands for the round trips to a real database, the window in which an
// unlocked request on the same account would interleave. Default: 0.
func WithWork(d time.Duration) Option {
	return func(c *config) { c.work = d }
}

// NewHandler returns the service's routes, with the mutating ones behind a lock per account
// taken from g; ledger keeps the balances. It panics when g or ledger is nil.
func NewHandler(g *guard.Guard, ledger *Ledger, opts ...Option) http.Handler {
	if g == nil || ledger == nil {
		panic("accounts: NewHandler needs a *guard.Guard and a *Ledger")
	}
	c := config{wait: DefaultWaitTime}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	h := &handler{ledger: ledger, tracer: c.tp.Tracer(ScopeName), work: c.work}

	r := chi.NewRouter()
	r.Use(serverSpans(h.tracer)) // no lock here: before routing there is no {id}
	lock := middleware.Lock(g, LockTemplate, guard.WaitTime(c.wait))
	r.Get("/accounts/{id}", h.balance)
	r.With(lock).Post("/accounts/{id}/deposit", h.update("accounts.deposit", deposit))
	r.With(lock).Post("/accounts/{id}/withdraw", h.update("accounts.withdraw", withdraw))
	return r
}

type handler struct {
	ledger *Ledger
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

func (h *handler) balance(w http.ResponseWriter, r *http.Request) {
	a, ok := account(w, r)
	if !ok {
		return
	}
	balance, fence := h.ledger.Balance(a)
	reply(w, http.StatusOK, "application/json", Balance{Tenant: a.Tenant, Account: a.ID, Balance: balance, Fence: fence})
}

// update returns the handler of a deposit or a withdrawal, which runs under the account's
// lock: it writes to the ledger with the lock's fence, in a span called name.
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

		balance, err := h.apply(ctx, a, l.Fence(), req.Amount, op)
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
		default: // the lock was lost, or the client went away: the context ended
			span.SetStatus(codes.Error, err.Error())
			problem(w, http.StatusServiceUnavailable, "The request ended before it could write; nothing was written.")
		}
	}
}

// apply runs op on account a in one ledger transaction, under the given fence.
func (h *handler) apply(ctx context.Context, a Account, fence uint64, amount int64, op change) (int64, error) {
	tx, err := h.ledger.Begin(a, fence)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	balance, err := op(tx.Balance(), amount)
	if err != nil {
		return 0, err
	}
	if h.work > 0 {
		t := time.NewTimer(h.work)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done(): // the lock was lost (the cause says so), or the client left
			return 0, context.Cause(ctx)
		}
	}
	return balance, tx.Commit(balance)
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
