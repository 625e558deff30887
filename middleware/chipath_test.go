package middleware_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/stretchr/testify/assert"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// Behind chi's path middleware (CleanPath, StripSlashes, URLFormat, in either order, before
// the router or in a subrouter), every spelling of an account's ID that chi routes to the
// route locks the account's one name — also spellings crafted so that the escaped and the
// decoded path each hold the other's pieces ("/accounts/%2561/../..//accounts//%61" is the
// account "a" behind CleanPath, which routes on the cleaned escaped path). So one resource
// never has two names, and two resources never share one.
func TestChiPathSpellings(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	lock := middleware.Lock(g, "acct:{id}")
	clean, strip, format := chimw.CleanPath, chimw.StripSlashes, chimw.URLFormat
	type mws = []func(http.Handler) http.Handler
	setups := []struct {
		name          string
		use, groupUse mws
		group, route  string // the route, in a group (r.Route) when group is set
		prefix        string // what comes before the ID in the route's paths
		suffix        string // what comes after it
		lockIn        string // "": r.With(lock) on the route; "use": the group's r.Use; "nested": the Use of a group in the group; "mount": the Use of a mounted router
	}{
		{"plain", nil, nil, "", "/accounts/{id}", "/accounts/", "", ""},
		{"CleanPath", mws{clean}, nil, "", "/accounts/{id}", "/accounts/", "", ""},
		{"StripSlashes", mws{strip}, nil, "", "/accounts/{id}", "/accounts/", "", ""},
		{"URLFormat", mws{format}, nil, "", "/accounts/{id}", "/accounts/", "", ""},
		{"CleanPath, StripSlashes", mws{clean, strip}, nil, "", "/accounts/{id}", "/accounts/", "", ""},
		{"StripSlashes, CleanPath", mws{strip, clean}, nil, "", "/accounts/{id}", "/accounts/", "", ""},
		{"CleanPath, URLFormat", mws{clean, format}, nil, "", "/accounts/{id}", "/accounts/", "", ""},
		{"StripSlashes, URLFormat", mws{strip, format}, nil, "", "/accounts/{id}", "/accounts/", "", ""},
		{"mounted group", nil, nil, "/accounts/{id}", "/", "/accounts/", "", ""},
		{"CleanPath before a group", mws{clean}, nil, "/accounts", "/{id}", "/accounts/", "", ""},
		{"StripSlashes in a subrouter", nil, mws{strip}, "/accounts", "/{id}", "/accounts/", "", ""},
		{"CleanPath, StripSlashes in a subrouter", mws{clean}, mws{strip}, "/accounts", "/{id}", "/accounts/", "", ""},
		{"StripSlashes before a mounted group", mws{strip}, nil, "/accounts/{id}", "/", "/accounts/", "", ""},
		{"CleanPath and a parameter of the group", mws{clean}, nil, "/x/{a}", "/{id}", "/x/%2561/", "", ""},
		{"StripSlashes and a parameter of the group", mws{strip}, nil, "/x/{a}", "/{id}", "/x/%2561/", "", ""},
		// The lock in the Use of the group that holds the ID: chi has matched the group's
		// "/accounts/{id}/*", and not yet the route in it.
		{"lock in a group's Use", nil, nil, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "use"},
		{"StripSlashes, lock in a group's Use", mws{strip}, nil, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "use"},
		{"URLFormat, lock in a group's Use", mws{format}, nil, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "use"},
		{"CleanPath, lock in a group's Use", mws{clean}, nil, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "use"},
		{"CleanPath, StripSlashes, lock in a group's Use", mws{clean, strip}, nil, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "use"},
		{"StripSlashes, URLFormat, lock in a group's Use", mws{strip, format}, nil, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "use"},
		{"StripSlashes in the group, lock in its Use", nil, mws{strip}, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "use"},
		{"URLFormat in the group, lock in its Use", nil, mws{format}, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "use"},
		{"StripSlashes, lock in a group's Use, the group's own path", mws{strip}, nil, "/accounts/{id}", "/", "/accounts/", "", "use"},
		{"StripSlashes, lock in a group's Use, a parameter after", mws{strip}, nil, "/accounts/{id}", "/{op}", "/accounts/", "/%2561", "use"},
		{"StripSlashes, lock in a nested group's Use", mws{strip}, nil, "/accounts", "/withdraw", "/accounts/", "/withdraw", "nested"},
		{"URLFormat, StripSlashes in the outer group, lock in a nested group's Use", mws{format}, mws{strip}, "/accounts", "/withdraw", "/accounts/", "/withdraw", "nested"},
		{"CleanPath, lock in a nested group's Use", mws{clean}, nil, "/accounts", "/withdraw", "/accounts/", "/withdraw", "nested"},
		{"StripSlashes, lock in a mounted router's Use", mws{strip}, nil, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "mount"},
		{"URLFormat, StripSlashes in a mounted router, lock in its Use", mws{format}, mws{strip}, "/accounts/{id}", "/withdraw", "/accounts/", "/withdraw", "mount"},
		{"CleanPath, lock in a mounted router's Use, parameter of the mount", mws{clean}, nil, "/x/{a}/accounts/{id}", "/withdraw", "/x/%2561/accounts/", "/withdraw", "mount"},
	}
	build := func(use, groupUse mws, group, route, lockIn string) http.Handler {
		r := chi.NewRouter()
		r.Use(use...)
		switch {
		case group == "":
			r.With(lock).Get(route, lockName)
		case lockIn == "":
			r.Route(group, func(r chi.Router) {
				r.Use(groupUse...)
				r.With(lock).Get(route, lockName)
			})
		case lockIn == "use":
			r.Route(group, func(r chi.Router) {
				r.Use(groupUse...)
				r.Use(lock)
				r.Get(route, lockName)
			})
		case lockIn == "nested":
			r.Route(group, func(r chi.Router) {
				r.Use(groupUse...)
				r.Route("/{id}", func(r chi.Router) {
					r.Use(lock)
					r.Get(route, lockName)
				})
			})
		case lockIn == "mount":
			sub := chi.NewRouter()
			sub.Use(groupUse...)
			sub.Use(lock)
			sub.Get(route, lockName)
			r.Mount(group, sub)
		}
		return r
	}
	ids := []string{"a", "%61", "%2561", "%41", "A", "%", "%25", "%2F", "a/b", "a%2Fb", "a b+", "é", "%C3%A9"}
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			h := build(s.use, s.groupUse, s.group, s.route, s.lockIn)
			routed := map[string]int{}
			for _, id := range ids {
				want := "acct:" + escapeValue(id)
				for _, path := range spellings(s.prefix, id, s.suffix, strings.Contains(s.name, "URLFormat")) {
					rec := httptest.NewRecorder()
					req := httptest.NewRequestWithContext(t.Context(), "GET", path, nil)
					h.ServeHTTP(rec, req)
					if rec.Code == http.StatusNotFound || rec.Code == http.StatusMethodNotAllowed {
						continue // this router has no route for this spelling
					}
					if rec.Code == http.StatusBadRequest && strings.Contains(rec.Body.String(), "{id}: empty value") {
						continue // a mount routed "/accounts//…" with an empty ID
					}
					routed[id]++
					if assert.Equal(t, http.StatusOK, rec.Code, "%s: %s", path, rec.Body) {
						assert.Equal(t, want, rec.Body.String(), "%s is the account %q", path, id)
					}
				}
				assert.Positive(t, routed[id], "no spelling of %q was routed", id)
			}
		})
	}
}

// spellings returns paths of the account id under prefix, a path that ends in '/', and
// followed by suffix: its ID spelled with every byte escaped, or none that need not be, in
// either case of hex; after slashes and dot segments that CleanPath removes, some of them
// decoys that hold the ID's escaped spelling in the decoded path; with a trailing slash, and
// with ".json" when json.
func spellings(prefix, id, suffix string, json bool) []string {
	enc := []string{url.PathEscape(id), escapeAll(id, "%%%02X"), escapeAll(id, "%%%02x")}
	var out []string
	for _, e := range enc {
		decoy := strings.ReplaceAll(e, "%", "%25") // decodes to e
		heads := []string{
			prefix,
			"/" + prefix,
			prefix + "/",
			"/z/.." + prefix,
			"/" + decoy + "/.." + prefix,
			prefix + decoy + "/../..//" + strings.TrimPrefix(prefix, "/") + "/",
			prefix + "./",
		}
		for _, head := range heads {
			out = append(out, head+e+suffix, head+e+suffix+"/")
			if json {
				out = append(out, head+e+suffix+".json")
			}
		}
	}
	return out
}

// escapeAll escapes every byte of s with format.
func escapeAll(s, format string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		fmt.Fprintf(&b, format, c)
	}
	return b.String()
}

// escapeValue renders v as the template engine escapes a value: letters, digits and -._~ —
// and letters, marks and digits of every script — as they are, every other byte as %XX.
func escapeValue(v string) string {
	var b strings.Builder
	for len(v) > 0 {
		r, n := utf8.DecodeRuneInString(v)
		switch {
		case r == utf8.RuneError && n == 1:
		case r < utf8.RuneSelf && ('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-._~", r)),
			r >= utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r)):
			b.WriteString(v[:n])
			v = v[n:]
			continue
		}
		for _, c := range []byte(v[:n]) {
			fmt.Fprintf(&b, "%%%02X", c)
		}
		v = v[n:]
	}
	return b.String()
}

// A request whose escaped and decoded paths both spell the route chi matched, with different
// values, is refused rather than named. Go's URL parser never makes such a pair (RawPath is
// always an escaping of Path); a middleware that rewrites the URL can.
func TestChiPathTwoReadings(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.URL.Path, r.URL.RawPath = "/accounts/%61/", "/accounts/%61" // a rewrite
			next.ServeHTTP(w, r)
		})
	}, chimw.StripSlashes)
	r.With(middleware.Lock(g, "acct:{id}")).Get("/accounts/{id}", lockName)
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", "/x", nil))
	p := requireProblem(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.String()}, http.StatusBadRequest)
	assert.Contains(t, p.Detail, "{id}: the request path reads as two different values")
}
