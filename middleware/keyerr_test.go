package middleware_test

import (
	"bytes"
	"context"
	"encoding"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// failingID is an ID type whose MarshalText fails with an error that tells internals.
type failingID struct{}

func (failingID) MarshalText() ([]byte, error) {
	return nil, errors.New("lookup tenant: dial tcp 10.1.2.3:5432: password authentication failed")
}

var _ encoding.TextMarshaler = failingID{}

// A LockFunc key whose error is, or wraps, a *guard.NameError — one made from a failing
// MarshalText, as a decorator's namer makes — is answered with a generic 400: the problem
// shows nothing of the error, which the middleware logs at debug level instead. The reasons
// the middleware's own names give (an empty value, a name too long) are still shown.
func TestKeyErrorNotShown(t *testing.T) {
	var logs bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })

	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	key := func(*http.Request) (string, error) {
		_, err := failingID{}.MarshalText()
		return "", fmt.Errorf("naming: %w", &guard.NameError{Name: "tenant:{ID}", Reason: "{ID}: MarshalText: " + err.Error()})
	}
	rec := httptest.NewRecorder()
	middleware.LockFunc(g, "tenant", key)(lockName).ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", "/", nil))
	p := requireProblem(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.String()}, http.StatusBadRequest)
	assert.Equal(t, "The lock name for this request cannot be made.", p.Detail)
	assert.Contains(t, logs.String(), "password authentication failed", "the detail is logged")
	assert.Contains(t, logs.String(), "level=DEBUG")

	long := func(*http.Request) (string, error) { return string(make([]byte, guard.MaxNameLen+1)), nil }
	rec = httptest.NewRecorder()
	middleware.LockFunc(g, "long", long)(lockName).ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", "/", nil))
	p = requireProblem(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.String()}, http.StatusBadRequest)
	assert.Contains(t, p.Detail, "more than 1024", "the middleware's own check says why")
}
