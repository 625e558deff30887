package lockname

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		src  string
		keys []string
		lits []string
	}{
		{"literal only", "report:daily", nil, []string{"report:daily"}},
		{"one key", "orders:{ID}", []string{"ID"}, []string{"orders:", ""}},
		{"two keys", "tenant:{Tenant.ID}:import:{Kind}", []string{"Tenant.ID", "Kind"}, []string{"tenant:", ":import:", ""}},
		{"key only", "{.}", []string{"."}, []string{"", ""}},
		{"escaped braces", "{{tag}}:{x}", []string{"x"}, []string{"{tag}:", ""}},
		{"hash tag around key", "{{tenant:{T}}}:job", []string{"T"}, []string{"{tenant:", "}:job"}},
		{"escaped brace after key", "{a}{{", []string{"a"}, []string{"", "{"}},
		{"closing braces after key", "{a}}}", []string{"a"}, []string{"", "}"}},
		{"separators", "a/{x}=>{y}", []string{"x", "y"}, []string{"a/", "=>", ""}},
		{"words between separators", "tenant:{T}:re-import:{K}", []string{"T", "K"}, []string{"tenant:", ":re-import:", ""}},
		{"unicode", "заказ→{id}", []string{"id"}, []string{"заказ→", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := Parse(tt.src)
			require.NoError(t, err)
			assert.Equal(t, tt.src, tmpl.String())
			assert.Equal(t, tt.keys, nilIfEmpty(tmpl.Keys()))
			assert.Equal(t, tt.lits, tmpl.lits)
		})
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, src, msg string
	}{
		{"empty", "", "empty template"},
		{"unclosed", "orders:{ID", "unclosed '{'"},
		{"unmatched close", "orders:ID}", "unmatched '}'"},
		{"nested", "orders:{a{b}}", "'{' inside placeholder"},
		{"empty key", "orders:{}", "empty placeholder"},
		{"space in key", "orders:{ ID}", "space or control"},
		{"adjacent", "x:{a}{b}", "need literal text between them"},
		{"control in literal", "a\nb:{x}", "control character"},
		{"invalid utf8", "a\xff:{x}", "not valid UTF-8"},
		{"single brace after key", "{a}}", "unmatched '}'"},
		{"percent separator", "{a}%{b}", "'%' in literal text"},
		{"percent in literal", "100%:{x}", "'%' in literal text"},
		{"letter before", "a{x}", "'a' right before {x}"},
		{"letter after", "{x}b", "'b' right after {x}"},
		{"letter between", "k:{x}b{y}", "'b' right after {x}"},
		{"digit after", "k:{x}1", "'1' right after {x}"},
		{"dot between", "{A}.{B}", "'.' right after {A}"},
		{"dash after", "digest:{Tenant}-weekly", "'-' right after {Tenant}"},
		{"underscore before", "a_{x}", "'_' right before {x}"},
		{"tilde before", "a~{x}", "'~' right before {x}"},
		{"non-ascii letter", "k:{a}é", "'é' right after {a}"},
		{"combining mark", "k:e\u0301{a}", "'\u0301' right before {a}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.src)
			var se *SyntaxError
			require.ErrorAs(t, err, &se)
			assert.Contains(t, se.Msg, tt.msg)
			assert.Equal(t, tt.src, se.Template)
		})
	}
}

func TestRender(t *testing.T) {
	tests := []struct {
		name string
		src  string
		vals []string
		want string
	}{
		{"plain", "orders:{ID}", []string{"A-17"}, "orders:A-17"},
		{"separator escaped", "orders:{ID}", []string{"7:items"}, "orders:7%3Aitems"},
		{"percent", "orders:{ID}", []string{"100%"}, "orders:100%25"},
		{"hash tag braces", "orders:{ID}", []string{"{x}"}, "orders:%7Bx%7D"},
		{"control bytes", "orders:{ID}", []string{"a\x00b\nc\x7f"}, "orders:a%00b%0Ac%7F"},
		{"invalid utf8", "orders:{ID}", []string{"a\xffb"}, "orders:a%FFb"},
		{"non-ascii kept", "orders:{ID}", []string{"zürich"}, "orders:zürich"},
		{"C1 control", "orders:{ID}", []string{"a\u0085"}, "orders:a%C2%85"},
		{"letters of literal kept", "orders:{ID}", []string{"orders"}, "orders:orders"},
		{"separator pair 1", "{A}:{B}", []string{"x:y", "z"}, "x%3Ay:z"},
		{"separator pair 2", "{A}:{B}", []string{"x", "y:z"}, "x:y%3Az"},
		{"kept punctuation", "k:{x}", []string{"a-b.c_d~e"}, "k:a-b.c_d~e"},
		{"other punctuation", "k:{x}", []string{"a/b@c+d e"}, "k:a%2Fb%40c%2Bd%20e"},
		{"separators of other templates", "k:{x}", []string{"a→b"}, "k:a%E2%86%92b"},
		{"combining mark kept", "k:{x}", []string{"é"}, "k:é"},
		{"replacement character", "k:{x}", []string{"a�"}, "k:a%EF%BF%BD"},
		{"unicode separator", "{a}→{b}", []string{"x→y", "é"}, "x%E2%86%92y→é"},
		{"literal only", "report", nil, "report"},
		{"hash tag template", "{{tenant:{T}}}:job", []string{"acme"}, "{tenant:acme}:job"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := Parse(tt.src)
			require.NoError(t, err)
			got, err := tmpl.Render(tt.vals)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			back, err := tmpl.Values(got)
			require.NoError(t, err)
			assert.Equal(t, tt.vals, nilIfEmpty(back))
		})
	}
}

func TestRenderErrors(t *testing.T) {
	tmpl, err := Parse("{A}:{B}")
	require.NoError(t, err)

	_, err = tmpl.Render([]string{"x", ""})
	var ve *ValueError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "B", ve.Key)

	_, err = tmpl.Render([]string{"x"})
	require.Error(t, err)
}

func TestValuesRejects(t *testing.T) {
	tmpl, err := Parse("p:{A}:{B}")
	require.NoError(t, err)
	for _, name := range []string{
		"q:x:y",    // prefix
		"p:x",      // no separator
		"p:x:y:z",  // unescaped separator in the last value
		"p:x%3:y",  // short escape
		"p:x%zz:y", // bad hex
		"p:x%41:y", // escape of a rune Render keeps
		"p::y",     // empty value
		"p:x%3ay",  // lower-case hex is not what Render writes
		"p:x/y:z",  // a separator that values never hold unescaped
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tmpl.Values(name)
			assert.Error(t, err)
		})
	}
}

// FuzzRender checks, for any template that parses and any two value tuples, that rendering is
// injective, that Values inverts it, and that names carry no control characters and no braces
// beyond the template's own.
func FuzzRender(f *testing.F) {
	seeds := []struct{ src, a1, b1, a2, b2 string }{
		{"{A}:{B}", "x:y", "z", "x", "y:z"}, // the annotation libraries' collision
		{"a/{x}/b/{y}", "1/b/2", "3", "1", "2/b/3"},
		{"{x}:{y}", "a%3Ab", "c", "a", "b:c"},
		{"{x}:{y}", "a:", "b", "a", ":b"},
		{"orders:{ID}", "{tag}", "", "%7Btag%7D", ""},
		{"{a}→{b}", "x→", "y", "x", "→y"},
		{"{a}é{b}", "è", "é", "\xc3", "\xa9"},
		{"tenant:{T}:import:{K}", "acme:import:x", "y", "acme", "x:import:y"},
		{"{{{a}}}:{b}", "}", "{", "}:", "{"},
		{"{a}%{b}", "%", "%%", "%%", "%"},
		{"{a}:%25{b}", "x%", "y", "x", "%y"},
		{"{a}:B:{b}", "\xbb", "B", "\xbb:B", "x"},
		{"{a}:1:{b}", "\x11", "1", "x", "1:1"},
		{"{a}:{b}:{c}", "x", "y:z", "x:y", "z"},
		{"{a}/ab/{b}", "x/a", "b/c", "x", "ab/c"},
		{"k:{a}", "\x00", "", "\u0000", ""},
		{"k:{a}", "\xff", "", "%FF", ""},
	}
	for _, s := range seeds {
		f.Add(s.src, s.a1, s.b1, s.a2, s.b2)
	}
	f.Fuzz(func(t *testing.T, src, a1, b1, a2, b2 string) {
		if len(src)+len(a1)+len(b1)+len(a2)+len(b2) > 256 {
			return // long inputs find nothing short ones do not, and slow the fuzzer down
		}
		tmpl, err := Parse(src)
		if err != nil {
			return
		}
		t1 := tuple(len(tmpl.keys), a1, b1)
		t2 := tuple(len(tmpl.keys), a2, b2)
		n1, err1 := tmpl.Render(t1)
		n2, err2 := tmpl.Render(t2)
		for _, c := range []struct {
			vals []string
			name string
			err  error
		}{{t1, n1, err1}, {t2, n2, err2}} {
			if slices.Contains(c.vals, "") {
				var ve *ValueError
				if !errors.As(c.err, &ve) {
					t.Fatalf("Render(%q) with an empty value: err = %v, want *ValueError", c.vals, c.err)
				}
				continue
			}
			if c.err != nil {
				t.Fatalf("Render(%q): %v", c.vals, c.err)
			}
			checkName(t, tmpl, c.name)
			back, err := tmpl.Values(c.name)
			if err != nil {
				t.Fatalf("Values(%q): %v", c.name, err)
			}
			if !slices.Equal(back, c.vals) {
				t.Fatalf("Values(Render(%q)) = %q", c.vals, back)
			}
		}
		if err1 == nil && err2 == nil && n1 == n2 && !slices.Equal(t1, t2) {
			t.Fatalf("template %q renders %q and %q to the same name %q", src, t1, t2, n1)
		}
	})
}

// tuple returns n values cycling through vals.
func tuple(n int, vals ...string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = vals[i%len(vals)]
	}
	return out
}

func checkName(t *testing.T, tmpl *Template, name string) {
	t.Helper()
	if !utf8.ValidString(name) {
		t.Fatalf("name %q is not valid UTF-8", name)
	}
	if strings.ContainsFunc(name, unicode.IsControl) {
		t.Fatalf("name %q contains a control character", name)
	}
	lit := strings.Join(tmpl.lits, "")
	for _, brace := range "{}" {
		if strings.Count(name, string(brace)) != strings.Count(lit, string(brace)) {
			t.Fatalf("name %q has braces that are not the template's (%q)", name, tmpl.src)
		}
	}
}

func BenchmarkRender(b *testing.B) {
	tmpl, err := Parse("tenant:{Tenant.ID}:import:{Kind}")
	require.NoError(b, err)
	vals := []string{"acme-corp", "invoices"}
	for b.Loop() {
		if _, err := tmpl.Render(vals); err != nil {
			b.Fatal(err)
		}
	}
}
