package middleware

import (
	"errors"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/guardlock/guard"
)

// chi hands out a URL parameter as a piece of the path it routed the request on. That path is
// the escaped one, URL.RawPath, when the path has escapes that Go would not write and nothing
// said otherwise; chi's CleanPath cleans that one; StripSlashes and URLFormat start from the
// decoded URL.Path instead; a subrouter routes on the rest of its parent's path. A parameter
// of the escaped path is decoded, as http.ServeMux decodes its values; one of the decoded path
// is the value already, and decoding it again would merge "%2561" (the account "%61") with
// "%61" (the account "a"). Which path chi routed on is not recorded, so the middleware works
// it out from what is: the patterns of the routes chi matched, level by level, and their
// parameters, which spell the path each level routed on — it replays the path middleware of
// chi on both of the request's paths and keeps the one that spells it.

// chiPath says which path chi routed a request on.
type chiPath uint8

const (
	chiUnknown chiPath = iota // not worked out yet
	chiEscaped                // URL.RawPath, or a path made from it: parameters are escaped
	chiDecoded                // URL.Path, or a path made from it: parameters are decoded
	chiEither                 // both spell the routes: the path reads two ways
)

// errTwoReadings is the reason of a request whose path chi may have routed either way, with a
// different value each way: crafted, since a path spelled so needs dot segments or empty ones
// that hold the escaped spelling of what follows them.
var errTwoReadings = errors.New("the request path reads as two different values (escaped and decoded); send it without dot segments and empty segments")

// chiValue returns v, a URL parameter of rc, chi's route context of q, decoded when chi routed
// q on its escaped path.
func (q *request) chiValue(rc *chi.Context, v string) (string, error) {
	if !strings.Contains(v, "%") || q.r.URL.RawPath == "" {
		// Nothing to decode, or no escaped path that differs from the decoded one: chi and
		// its middleware read URL.Path.
		return v, nil
	}
	if q.chiPath == chiUnknown {
		q.chiPath = chiRouted(q.r, rc)
	}
	switch q.chiPath {
	case chiDecoded:
		return v, nil
	case chiEither:
		return "", errTwoReadings
	}
	if len(v) > 3*guard.MaxNameLen {
		return v, nil // too long for a name even decoded: spare decoding it
	}
	if d, err := url.PathUnescape(v); err == nil {
		return d, nil
	}
	return v, nil
}

// chiRouted works out which path chi routed r on (r has a URL.RawPath). It replays what chi
// and its path middleware do with each of r's paths — CleanPath first on the escaped one;
// StripSlashes or URLFormat first on the decoded one; then StripSlashes and URLFormat, up to
// twice, on each level's path — and keeps each path from which some replay spells the route
// patterns that chi matched with their parameters. When neither does (a middleware of the
// program's own rewrote chi's RoutePath), it guesses from where the pieces of the routes
// occur in each path (chiGuess).
func chiRouted(r *http.Request, rc *chi.Context) chiPath {
	lv, ok := chiLevelsOf(rc)
	if !ok {
		return chiGuess(r, rc)
	}
	escaped, decoded := lv.readings(r, rc.RoutePath, true)
	if !escaped && !decoded {
		escaped, decoded = lv.readings(r, rc.RoutePath, false)
	}
	switch {
	case escaped && decoded:
		return chiEither
	case escaped:
		return chiEscaped
	case decoded:
		return chiDecoded
	}
	return chiGuess(r, rc)
}

// chiLevels are the routes chi matched, one per router from the outermost in: a pattern, and
// its parameters' values. Every level but the last mounts a subrouter, which routes on "/"
// and the rest of its level's path. The last level mounts one too when the middleware runs in
// that subrouter (its Use, as in r.Route("/accounts/{id}", …) with r.Use(lock) in it): chi
// has matched "/accounts/{id}/*", emptied its "*" and set RoutePath to "/" and the rest, and
// has not matched the subrouter's route yet (pendingMount).
type chiLevels []chiLevel

type chiLevel struct {
	pattern string
	values  []string
}

// chiLevelsOf splits rc's URL parameters among its route patterns. It reports false when they
// do not add up, as when a chi router serves another's request without being mounted.
func chiLevelsOf(rc *chi.Context) (chiLevels, bool) {
	lv := make(chiLevels, len(rc.RoutePatterns))
	vals := rc.URLParams.Values
	for i, p := range rc.RoutePatterns {
		n := countParams(p)
		if n > len(vals) {
			return nil, false
		}
		lv[i] = chiLevel{pattern: p, values: vals[:n]}
		vals = vals[n:]
	}
	return lv, len(vals) == 0 && len(lv) > 0
}

// readings reports whether the routes spell r's escaped path (cleaned by CleanPath or not)
// and its decoded path (changed by StripSlashes or URLFormat or not). With pending, a last
// level that may be a pending mount spells a path only as a mount; without, only as an
// endpoint.
func (lv chiLevels) readings(r *http.Request, routePath string, pending bool) (escaped, decoded bool) {
	if pending && !lv[len(lv)-1].pendingMount() {
		return false, false
	}
	raw, dec := r.URL.RawPath, r.URL.Path
	escaped = lv.spells(0, raw, routePath, pending) || lv.spells(0, path.Clean(raw), routePath, pending)
	decoded = lv.spells(0, dec, routePath, pending)
	if s := stripSlash(dec); s != dec {
		decoded = decoded || lv.spells(0, s, routePath, pending)
	}
	if s := urlFormat(dec); s != dec {
		decoded = decoded || lv.spells(0, s, routePath, pending)
	}
	return escaped, decoded
}

// spells reports whether level k of the routes routed on s, or on s changed by StripSlashes
// and URLFormat (up to twice), and the levels after it on the rest. With pending, the last
// level is a pending mount: it spells s when it mounts a subrouter on a rest that is
// routePath, chi's RoutePath as the middleware sees it, as it is or as StripSlashes and
// URLFormat in the subrouter made it.
func (lv chiLevels) spells(k int, s, routePath string, pending bool) bool {
	last := k == len(lv)-1
	for _, s := range pathVariants(s) {
		switch rest, ok := lv[k].match(s, !last || pending); {
		case !ok:
		case !last:
			if lv.spells(k+1, "/"+rest, routePath, pending) {
				return true
			}
		case !pending || containsString(pathVariants("/"+rest), routePath):
			return true
		}
	}
	return false
}

// pendingMount reports whether the level may mount a subrouter whose route chi has not matched
// yet: its pattern ends in "/*" and the "*" is empty, as chi's Mount leaves it for the
// subrouter. An endpoint "/files/*" requested as "/files/" reads the same; a pending mount
// is tried first, as the endpoint's path does not spell it unless its routing path is "/",
// where both read alike.
func (l chiLevel) pendingMount() bool {
	return strings.HasSuffix(l.pattern, "/*") && len(l.values) > 0 && l.values[len(l.values)-1] == ""
}

// match reports whether the level's pattern with its values spells s: all of it, or, for a
// level that mounts a subrouter, its start, and returns the rest that the subrouter routes
// on. A mount's own "*" has lost its value (chi empties it); an endpoint's "*" has its value.
func (l chiLevel) match(s string, mount bool) (rest string, ok bool) {
	p, vals := l.pattern, l.values
	depth, start := 0, 0
	literal := func(end int) bool {
		lit := p[start:end]
		if !strings.HasPrefix(s, lit) {
			return false
		}
		s = s[len(lit):]
		return true
	}
	value := func() bool {
		if len(vals) == 0 {
			return false
		}
		v := vals[0]
		vals = vals[1:]
		if !strings.HasPrefix(s, v) {
			return false
		}
		s = s[len(v):]
		return true
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '{':
			if depth == 0 && !literal(i) {
				return "", false
			}
			depth++
		case c == '}' && depth > 0:
			depth--
			if depth == 0 {
				if !value() {
					return "", false
				}
				start = i + 1
			}
		case c == '*' && depth == 0:
			if !literal(i) {
				return "", false
			}
			if mount && i == len(p)-1 {
				return s, true
			}
			if !value() {
				return "", false
			}
			start = i + 1
		}
	}
	if depth != 0 || !literal(len(p)) || s != "" {
		return "", false
	}
	return "", true
}

// countParams returns how many URL parameters a chi pattern has: its "{name}" and
// "{name:regexp}" placeholders and its "*".
func countParams(p string) int {
	n, depth := 0, 0
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '{':
			if depth == 0 {
				n++
			}
			depth++
		case c == '}' && depth > 0:
			depth--
		case c == '*' && depth == 0:
			n++
		}
	}
	return n
}

// pathVariants returns s and what StripSlashes and URLFormat, one after the other in either
// order and each up to twice in all, make of it.
func pathVariants(s string) []string {
	out := []string{s}
	for range 2 {
		for _, v := range out {
			for _, w := range [2]string{stripSlash(v), urlFormat(v)} {
				if w != v && !containsString(out, w) {
					out = append(out, w)
				}
			}
		}
	}
	return out
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// stripSlash is what chi's StripSlashes makes of a routing path.
func stripSlash(s string) string {
	if len(s) > 1 && s[len(s)-1] == '/' {
		return s[:len(s)-1]
	}
	return s
}

// urlFormat is what chi's URLFormat makes of a routing path: the extension of its last
// segment cut off.
func urlFormat(s string) string {
	if strings.Index(s, ".") <= 0 {
		return s
	}
	base := strings.LastIndex(s, "/")
	if base < 0 {
		return s
	}
	if idx := strings.LastIndex(s[base:], "."); idx > 0 {
		return s[:base+idx]
	}
	return s
}

// chiGuess tells which path chi routed r on when no replay of chi's middleware spells its
// routes: a middleware of the program's own set chi's RoutePath. Every path chi routed on,
// every parameter value and every literal piece of the matched patterns is then a piece of
// RawPath or of Path, whichever was routed on, and one that is a piece of only one of them
// tells which; when nothing tells, RawPath it is, as chi does without such middleware. A path
// crafted to hold pieces of both can mislead the guess: PathValues makes the program say.
func chiGuess(r *http.Request, rc *chi.Context) chiPath {
	raw, dec := r.URL.RawPath, r.URL.Path
	if rc.RoutePath == "" {
		return chiEscaped // no middleware and no subrouter chose a path: chi took RawPath
	}
	tells := func(piece string) (chiPath, bool) {
		inRaw, inDec := strings.Contains(raw, piece), strings.Contains(dec, piece)
		if inRaw {
			return chiEscaped, inRaw != inDec
		}
		return chiDecoded, inRaw != inDec
	}
	if p, ok := tells(rc.RoutePath); ok {
		return p
	}
	for _, v := range rc.URLParams.Values {
		if p, ok := tells(v); v != "" && ok {
			return p
		}
	}
	for _, pat := range rc.RoutePatterns {
		for _, lit := range patternLiterals(pat) {
			if p, ok := tells(lit); ok {
				return p
			}
		}
	}
	return chiEscaped
}

// patternLiterals returns the literal pieces of a chi route pattern: the text outside its
// "{param}" and "{param:regexp}" placeholders and its "*".
func patternLiterals(p string) []string {
	var lits []string
	depth, start := 0, 0
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '{':
			if depth == 0 && i > start {
				lits = append(lits, p[start:i])
			}
			depth++
		case c == '}' && depth > 0:
			depth--
			start = i + 1
		case c == '*' && depth == 0:
			if i > start {
				lits = append(lits, p[start:i])
			}
			start = i + 1
		}
	}
	if depth == 0 && start < len(p) {
		lits = append(lits, p[start:])
	}
	return lits
}
