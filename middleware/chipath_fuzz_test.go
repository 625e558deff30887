package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// FuzzChiPath sends arbitrary paths through chi setups with path middleware and checks each
// routed request's lock name against chi's own parameter read the way chi routed it: decoded
// when the first middleware to choose chi's routing path (or chi, when none did) chose the
// escaped path, as it is when one chose the decoded path. The middleware works that out from
// the matched routes (chipath.go); the fuzz target works it out forward, from the setup.
func FuzzChiPath(f *testing.F) {
	for _, seed := range []string{
		"/accounts/a", "/accounts/%61", "/accounts/%2561/", "/accounts/%2561/../..//accounts//%61",
		"/accounts/%25%32%35/", "/accounts/%25%32%35.json", "//accounts/a%2Fb", "/x/../accounts/%2F/",
		"/%61ccounts/%2561/", "/accounts/%2525%2536%2531/../..//accounts//%25%36%31",
		"/accounts/%2525/withdraw", "/accounts/%25%32%35/withdraw/", "/accounts/%25%32%35/withdraw.json",
		"/accounts/%2561/../..//accounts//%61/withdraw/", "/accounts/%25%32%35/%2561/", "/accounts/%2561/../%61/.0/",
	} {
		for setup := range len(fuzzSetups) {
			f.Add(uint8(setup), seed)
		}
	}
	g := guard.New(memstore.New())
	f.Cleanup(func() { _ = g.Close(context.Background()) })
	lock := middleware.Lock(g, "acct:{id}")
	f.Fuzz(func(t *testing.T, setup uint8, path string) {
		if !strings.HasPrefix(path, "/") || len(path) > 200 ||
			strings.ContainsFunc(path, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return // not a request line's path
		}
		u, err := url.ParseRequestURI(path)
		if err != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
			return
		}
		s := fuzzSetups[int(setup)%len(fuzzSetups)]
		req := httptest.NewRequestWithContext(t.Context(), "GET", "http://x"+path, nil)
		var want string
		escaped := s.escaped(req)
		rec := httptest.NewRecorder()
		probe := s.build(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// chi's own view of the parameter, then the middleware's name
				v := chi.URLParam(r, "id")
				if escaped {
					if d, err := url.PathUnescape(v); err == nil {
						v = d
					}
				}
				want = "acct:" + escapeValue(v)
				lock(next).ServeHTTP(w, r)
			})
		})
		probe.ServeHTTP(rec, req)
		switch {
		case rec.Code == http.StatusNotFound || rec.Code == http.StatusMethodNotAllowed:
		case rec.Code == http.StatusBadRequest && (want == "acct:" || len(want) > guard.MaxNameLen):
		case rec.Code != http.StatusOK:
			t.Fatalf("%s %q: %d %s", s.name, path, rec.Code, rec.Body)
		case rec.Body.String() != want:
			t.Fatalf("%s %q: locked %q, chi routed %q", s.name, path, rec.Body, want)
		}
	})
}

// fuzzSetup is a chi router with path middleware before it, and what that middleware makes
// chi route on.
type fuzzSetup struct {
	name  string
	use   []string // "clean", "strip", "format", in order
	group bool     // the route is in a subrouter: r.Route("/accounts", …"/{id}")
	// lockIn puts the lock in a subrouter's Use, before chi matches the subrouter's routes
	// "/{op}" and "/": "use" in r.Route("/accounts/{id}", …); "nested" in r.Route("/{id}", …)
	// in r.Route("/accounts", …); "mount" in a router mounted on "/accounts/{id}" after
	// StripSlashes and URLFormat of its own.
	lockIn string
}

var fuzzSetups = []fuzzSetup{
	{"plain", nil, false, ""},
	{"CleanPath", []string{"clean"}, false, ""},
	{"StripSlashes", []string{"strip"}, false, ""},
	{"URLFormat", []string{"format"}, false, ""},
	{"CleanPath, StripSlashes", []string{"clean", "strip"}, false, ""},
	{"StripSlashes, CleanPath", []string{"strip", "clean"}, true, ""},
	{"URLFormat, CleanPath", []string{"format", "clean"}, true, ""},
	{"group", nil, true, ""},
	{"CleanPath, group", []string{"clean"}, true, ""},
	{"lock in a group's Use", nil, true, "use"},
	{"StripSlashes, lock in a group's Use", []string{"strip"}, true, "use"},
	{"URLFormat, StripSlashes, lock in a group's Use", []string{"format", "strip"}, true, "use"},
	{"CleanPath, lock in a group's Use", []string{"clean"}, true, "use"},
	{"StripSlashes, CleanPath, lock in a nested group's Use", []string{"strip", "clean"}, true, "nested"},
	{"URLFormat, lock in a nested group's Use", []string{"format"}, true, "nested"},
	{"StripSlashes, lock in a mounted router's Use", []string{"strip"}, true, "mount"},
}

func (s fuzzSetup) build(lock func(http.Handler) http.Handler) http.Handler {
	r := chi.NewRouter()
	for _, u := range s.use {
		r.Use(map[string]func(http.Handler) http.Handler{
			"clean": chimw.CleanPath, "strip": chimw.StripSlashes, "format": chimw.URLFormat,
		}[u])
	}
	routes := func(r chi.Router) {
		r.Use(lock)
		r.Get("/{op}", lockName)
		r.Get("/", lockName)
	}
	switch {
	case !s.group:
		r.With(lock).Get("/accounts/{id}", lockName)
	case s.lockIn == "use":
		r.Route("/accounts/{id}", routes)
	case s.lockIn == "nested":
		r.Route("/accounts", func(r chi.Router) { r.Route("/{id}", routes) })
	case s.lockIn == "mount":
		sub := chi.NewRouter()
		sub.Use(chimw.StripSlashes, chimw.URLFormat)
		routes(sub)
		r.Mount("/accounts/{id}", sub)
	default:
		r.Route("/accounts", func(r chi.Router) { r.With(lock).Get("/{id}", lockName) })
	}
	return r
}

// escaped reports whether chi routes r on its escaped path behind s: the first middleware that
// sets chi's routing path decides, as each reads it (CleanPath: RawPath when set;
// StripSlashes and URLFormat: the decoded Path, and only when they change it); with none,
// chi takes RawPath when it is set.
func (s fuzzSetup) escaped(r *http.Request) bool {
	raw, dec := r.URL.RawPath, r.URL.Path
	for _, u := range s.use {
		switch u {
		case "clean":
			return raw != ""
		case "strip":
			if len(dec) > 1 && strings.HasSuffix(dec, "/") {
				return false
			}
		case "format":
			if strings.Index(dec, ".") > 0 {
				base := strings.LastIndex(dec, "/")
				if base >= 0 && strings.LastIndex(dec[base:], ".") > 0 {
					return false
				}
			}
		}
	}
	return raw != ""
}
