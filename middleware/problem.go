package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/guardlock/guard"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// writeProblem answers with status and a problem body. The type is "about:blank", so the title
// is the status text.
func writeProblem(w http.ResponseWriter, status int, detail string) {
	title := http.StatusText(status)
	if status == statusClientClosed {
		title = "Client Closed Request"
	}
	body, _ := json.Marshal(problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// busy answers a request whose lock is held by someone else.
func (m *locker) busy(w http.ResponseWriter, r *http.Request, err error) {
	if m.cfg.onBusy != nil {
		m.cfg.onBusy(w, r, err)
		return
	}
	if s := retryAfter(err); s > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(s, 10))
	}
	detail := "Another request holds the lock on this resource. Try again later."
	if m.cfg.permits > 0 {
		detail = "This resource admits " + strconv.Itoa(m.cfg.permits) + " requests at a time, and as many are in. Try again later."
	}
	writeProblem(w, m.cfg.busyStatus, detail)
}

// retryAfter returns the holder's remaining lease in whole seconds, rounded up, or 0 when it
// is not known.
func retryAfter(err error) int64 {
	var b *guard.BusyError
	if !errors.As(err, &b) || b.Remaining <= 0 {
		return 0
	}
	return int64((b.Remaining + time.Second - 1) / time.Second)
}

// pastDeadline reports whether ctx, a request's, ended because its deadline passed: a
// deadline that the server set (a timeout middleware), not a client that left (net/http
// cancels the context then).
func pastDeadline(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.DeadlineExceeded)
}

// clientLeft ends a request whose client left — its context was cancelled, not timed out —
// before its handler could run (while its body came, while it waited, or as the lock was
// granted) without an answer: nobody reads one, and a client that still reads — over
// HTTP/1.1, one that half-closed its connection after its request, which net/http takes for
// leaving — must not take one for its handler's (a handler that writes nothing is answered
// 200). Over HTTP/1 it closes the connection unanswered. Where it cannot take the connection
// (HTTP/2, whose client reset the stream, and a ResponseWriter without Hijack) it answers
// 499 Client Closed Request, which a log shows for what it is.
func clientLeft(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	writeProblem(w, statusClientClosed, "The client closed the request before the lock on this resource was taken.")
}

// statusClientClosed is the status of a request whose client closed it before it was
// answered: not in RFC 9110, common in access logs.
const statusClientClosed = 499

// timeUp answers a request whose deadline passed before its handler could run: while its
// body came, while it waited for the lock, or as the lock was granted.
func timeUp(w http.ResponseWriter) {
	writeProblem(w, http.StatusServiceUnavailable, "The request ran out of time before the lock on this resource could be taken. Try again later.")
}

// keyError is the error of a LockFunc key function: the program's, which may tell anything —
// a MarshalText error, a database's address — and is never shown to the client.
type keyError struct{ err error }

func (e *keyError) Error() string { return e.err.Error() }
func (e *keyError) Unwrap() error { return e.err }

// badName answers a request whose lock name cannot be made. The detail carries the reason of
// a *guard.NameError of the middleware's own — from the template and the limits, never the
// request's data. A LockFunc key function's error is not shown: it is logged at debug level
// with slog's default logger.
func (m *locker) badName(w http.ResponseWriter, r *http.Request, err error) {
	detail := "The lock name for this request cannot be made."
	if ke, ok := errors.AsType[*keyError](err); ok {
		slog.DebugContext(r.Context(), "guard/middleware: the key function found no lock name", "label", m.label, "err", ke.err)
	} else if ne, ok := errors.AsType[*guard.NameError](err); ok {
		detail = "The lock name for this request cannot be made: " + ne.Reason + "."
	}
	writeProblem(w, http.StatusBadRequest, detail)
}
