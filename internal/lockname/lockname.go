package lockname

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Template is a compiled lock-name template. It is immutable and safe for concurrent use.
type Template struct {
	src  string
	lits []string // len(keys)+1 literal texts, braces unescaped; inner ones are never empty
	keys []string // placeholder keys, in order
}

// SyntaxError reports a template that does not parse.
type SyntaxError struct {
	Template string
	Offset   int // byte offset of the problem in Template
	Msg      string
}

// Error describes the problem and where it is.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("lockname: template %q: %s (at byte %d)", e.Template, e.Msg, e.Offset)
}

// ValueError reports a value that cannot be rendered into its placeholder.
type ValueError struct {
	Key    string
	Reason string
}

// Error names the placeholder and the reason.
func (e *ValueError) Error() string {
	return fmt.Sprintf("lockname: placeholder {%s}: %s", e.Key, e.Reason)
}

// Parse compiles a template: literal text with "{key}" placeholders, "{{" and "}}" standing for
// literal braces. It rejects an empty template, invalid UTF-8, control characters, an
// unmatched or nested brace, an empty key or one with spaces or control characters, two
// placeholders with no literal text between them, '%' in literal text, and a placeholder that
// touches a word rune of literal text (see the package doc). It returns a *SyntaxError.
func Parse(src string) (*Template, error) {
	fail := func(off int, format string, args ...any) (*Template, error) {
		return nil, &SyntaxError{Template: src, Offset: off, Msg: fmt.Sprintf(format, args...)}
	}
	if src == "" {
		return fail(0, "empty template")
	}
	if !utf8.ValidString(src) {
		return fail(0, "not valid UTF-8")
	}
	t := &Template{src: src}
	var lit strings.Builder
	var bounds [][2]int // the offsets in src of each placeholder's '{' and of the byte after its '}'
	for i := 0; i < len(src); {
		switch c := src[i]; {
		case c == '{' && strings.HasPrefix(src[i:], "{{"):
			lit.WriteByte('{')
			i += 2
		case c == '}' && strings.HasPrefix(src[i:], "}}"):
			lit.WriteByte('}')
			i += 2
		case c == '}':
			return fail(i, "unmatched '}' (write '}}' for a literal brace)")
		case c == '{':
			end := strings.IndexByte(src[i+1:], '}')
			if end < 0 {
				return fail(i, "unclosed '{' (write '{{' for a literal brace)")
			}
			key := src[i+1 : i+1+end]
			if j := strings.IndexByte(key, '{'); j >= 0 {
				return fail(i+1+j, "'{' inside placeholder")
			}
			if key == "" {
				return fail(i, "empty placeholder {}")
			}
			if j := strings.IndexFunc(key, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); j >= 0 {
				return fail(i+1+j, "placeholder {%s} contains a space or control character", key)
			}
			if len(t.keys) > 0 && lit.Len() == 0 {
				return fail(i, "placeholders {%s} and {%s} need literal text between them", t.keys[len(t.keys)-1], key)
			}
			t.lits = append(t.lits, lit.String())
			t.keys = append(t.keys, key)
			lit.Reset()
			bounds = append(bounds, [2]int{i, i + end + 2})
			i += end + 2
		default:
			r, n := utf8.DecodeRuneInString(src[i:])
			switch {
			case unicode.IsControl(r):
				return fail(i, "control character %U in literal text", r)
			case r == '%':
				return fail(i, "'%%' in literal text (it starts the escapes in values)")
			}
			lit.WriteString(src[i : i+n])
			i += n
		}
	}
	t.lits = append(t.lits, lit.String())

	// Each placeholder stands between separators, or at an end of the template: a value is
	// then always one whole word of the name (see the package doc).
	for k, b := range bounds {
		if r, n := utf8.DecodeLastRuneInString(src[:b[0]]); n > 0 && kept(r) {
			return fail(b[0]-n, "%q right before {%s}: values keep letters, digits and %q, so it cannot "+
				"mark where the value starts; put a separator such as ':' or '/' between them", r, t.keys[k], keptPunct)
		}
		if r, n := utf8.DecodeRuneInString(src[b[1]:]); n > 0 && kept(r) {
			return fail(b[1], "%q right after {%s}: values keep letters, digits and %q, so it cannot "+
				"mark where the value ends; put a separator such as ':' or '/' between them", r, t.keys[k], keptPunct)
		}
	}
	return t, nil
}

// keptPunct is the punctuation that values keep: RFC 3986's unreserved marks.
const keptPunct = "-._~"

// keptASCII says which ASCII bytes values keep: letters, digits and keptPunct.
var keptASCII = func() (kept [utf8.RuneSelf]bool) {
	for c := range byte(utf8.RuneSelf) {
		kept[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte(keptPunct, c) >= 0
	}
	return kept
}()

// kept reports whether Render copies r from a value unchanged: a letter, a mark, a decimal
// digit, or one of keptPunct. These are the word runes of a name; every other rune separates
// words, and a value holds it only escaped.
func kept(r rune) bool {
	if r < utf8.RuneSelf {
		return keptASCII[r]
	}
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r)
}

// String returns the template's source text.
func (t *Template) String() string { return t.src }

// Keys returns the placeholder keys in order of appearance, as written between the braces.
func (t *Template) Keys() []string { return slices.Clone(t.keys) }

// MinLen returns the length in bytes of the shortest name that t renders: its literal text,
// and one byte for each placeholder. A value renders at least as long as it is.
func (t *Template) MinLen() int {
	n := len(t.keys)
	for _, l := range t.lits {
		n += len(l)
	}
	return n
}

// Render fills the placeholders with vals, one per key in order, each escaped as the package
// doc says. An empty value is a *ValueError. Render does not bound the length of the result;
// callers check it against their limit.
func (t *Template) Render(vals []string) (string, error) {
	if len(vals) != len(t.keys) {
		return "", fmt.Errorf("lockname: template %q has %d placeholders, got %d values", t.src, len(t.keys), len(vals))
	}
	n := len(t.lits[0])
	for i, v := range vals {
		if v == "" {
			return "", &ValueError{Key: t.keys[i], Reason: "empty value"}
		}
		n += len(v) + len(t.lits[i+1])
	}
	var b strings.Builder
	b.Grow(n + n/4)
	b.WriteString(t.lits[0])
	for i, v := range vals {
		t.escape(&b, v)
		b.WriteString(t.lits[i+1])
	}
	return b.String(), nil
}

// escape writes v to b, percent-encoding every byte of each rune that values do not keep, and
// bytes that are not valid UTF-8.
func (t *Template) escape(b *strings.Builder, v string) {
	for i := 0; i < len(v); {
		if c := v[i]; c < utf8.RuneSelf {
			if keptASCII[c] {
				b.WriteByte(c)
			} else {
				writePercent(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(v[i:])
		if (r != utf8.RuneError || n > 1) && kept(r) {
			b.WriteString(v[i : i+n])
		} else {
			for j := range n {
				writePercent(b, v[i+j])
			}
		}
		i += n
	}
}

const hexDigits = "0123456789ABCDEF"

func writePercent(b *strings.Builder, c byte) {
	b.WriteByte('%')
	b.WriteByte(hexDigits[c>>4])
	b.WriteByte(hexDigits[c&15])
}

// Values parses a name rendered from t back into its values: Values(Render(vals)) == vals.
// It fails for a name that Render cannot produce from t.
func (t *Template) Values(name string) ([]string, error) {
	fail := func(why string) ([]string, error) {
		return nil, fmt.Errorf("lockname: %q was not rendered from template %q: %s", name, t.src, why)
	}
	head, tail := t.lits[0], t.lits[len(t.lits)-1]
	if len(t.keys) == 0 {
		if name != head {
			return fail("different literal")
		}
		return nil, nil
	}
	if len(name) < len(head)+len(tail) || !strings.HasPrefix(name, head) || !strings.HasSuffix(name, tail) {
		return fail("prefix or suffix differs")
	}
	rest := name[len(head) : len(name)-len(tail)]
	vals := make([]string, len(t.keys))
	for i := range t.keys {
		part := rest
		if i < len(t.keys)-1 {
			// The inner literal's first rune is escaped in values: its first unescaped
			// occurrence ends this value.
			sep := t.lits[i+1]
			j := indexRaw(rest, sep)
			if j < 0 {
				return fail(fmt.Sprintf("no %q after {%s}", sep, t.keys[i]))
			}
			part, rest = rest[:j], rest[j+len(sep):]
		}
		v, ok := unescape(part)
		if !ok {
			return fail(fmt.Sprintf("bad escape in {%s}", t.keys[i]))
		}
		vals[i] = v
	}
	if again, err := t.Render(vals); err != nil || again != name {
		return fail("not in the form Render writes")
	}
	return vals, nil
}

// indexRaw returns the index of the first occurrence of sep in s that starts outside a "%XX"
// escape, or -1. sep must not start with '%'.
func indexRaw(s, sep string) int {
	first, _ := utf8.DecodeRuneInString(sep)
	for i := 0; i < len(s); {
		if s[i] == '%' {
			i += 3
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == first {
			if strings.HasPrefix(s[i:], sep) {
				return i
			}
			return -1
		}
		i += n
	}
	return -1
}

// unescape decodes "%XX" sequences; it reports false for a '%' without two hex digits.
func unescape(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", false
		}
		b = append(b, hi<<4|lo)
		i += 2
	}
	return string(b), true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
