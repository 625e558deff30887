package middleware

import (
	"encoding/json"
	"errors"
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
	body, _ := json.Marshal(problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
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
	writeProblem(w, m.cfg.busyStatus, "Another request holds the lock on this resource. Try again later.")
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

// badName answers a request whose lock name cannot be made. The detail carries the reason of
// a *guard.NameError — from the template and the limits, never the request's data.
func badName(w http.ResponseWriter, err error) {
	detail := "The lock name for this request cannot be made."
	if ne, ok := errors.AsType[*guard.NameError](err); ok {
		detail = "The lock name for this request cannot be made: " + ne.Reason + "."
	}
	writeProblem(w, http.StatusBadRequest, detail)
}
