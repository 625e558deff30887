package lockname

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// The tests of this file check what keeps the names of different templates apart: a name
// splits into separator runs and words the same way, whatever template rendered it, and each
// value is one whole word. So two templates can render one name only if they have the same
// separators in the same places, word for word equal where both have literal text.

// piece is one piece of a template or a name as a reader splits it: a run of separator runes,
// a word, or (in a template) a placeholder, which stands for one word.
type piece struct {
	sep  bool   // a separator run
	text string // the separators or the word; for a placeholder, its rendered value
	key  string // a placeholder's key; "" for literal text and for names
}

func (p piece) String() string {
	switch {
	case p.sep:
		return fmt.Sprintf("sep %q", p.text)
	case p.key != "":
		return fmt.Sprintf("{%s}=%q", p.key, p.text)
	}
	return fmt.Sprintf("word %q", p.text)
}

// wordRune says which runes are word runes in a name, as docs/templates.md states the rule:
// letters, marks, digits and "-._~", which values keep, and '%', which starts their escapes.
// Every other rune separates words.
func wordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) || strings.ContainsRune("-._~%", r)
}

// split splits text into separator runs and words.
func split(text string) []piece {
	var out []piece
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		sep := !wordRune(r)
		if len(out) > 0 && out[len(out)-1].sep == sep {
			out[len(out)-1].text += text[i : i+n]
		} else {
			out = append(out, piece{sep: sep, text: text[i : i+n]})
		}
		i += n
	}
	return out
}

// templatePieces splits tmpl, rendered with vals, into pieces: its literal text split as
// names are, and one piece per placeholder holding its rendered value. Pieces of literal text
// that touch a placeholder's piece are not merged with it.
func templatePieces(tmpl *Template, vals []string) []piece {
	var out []piece
	for i, lit := range tmpl.lits {
		out = append(out, split(lit)...)
		if i < len(tmpl.keys) {
			var b strings.Builder
			tmpl.escape(&b, vals[i])
			out = append(out, piece{text: b.String(), key: tmpl.keys[i]})
		}
	}
	return out
}

// checkPieces fails unless name, rendered from tmpl with vals, splits into the pieces of the
// template: each value one whole word, between separators of the template's literal text.
func checkPieces(t *testing.T, tmpl *Template, vals []string, name string) {
	t.Helper()
	want := templatePieces(tmpl, vals)
	got := split(name)
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].sep == want[i].sep && got[i].text == want[i].text
	}
	if !ok {
		t.Fatalf("template %q with %q renders %q, which splits into %v, not into the template's %v",
			tmpl.src, vals, name, got, want)
	}
}

// compatible reports whether two templates may render one name by the rule: the same
// separators in the same places, and at each word either the same literal text, or a
// placeholder on one side at least.
func compatible(a, b []piece) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		switch {
		case a[i].sep != b[i].sep:
			return false
		case a[i].key != "" || b[i].key != "":
		case a[i].text != b[i].text:
			return false
		}
	}
	return true
}

// checkPair renders t1 with vals and fails if t2, which has another shape, renders the same
// name: by Values, which finds t2's values of a name when there are any, and against n2, a
// name that t2 rendered.
func checkPair(t *testing.T, t1, t2 *Template, vals []string, n2 string) {
	t.Helper()
	n1, err := t1.Render(vals)
	if err != nil {
		return
	}
	checkPieces(t, t1, vals, n1)
	shape1 := templatePieces(t1, vals)
	if vals2, err := t2.Values(n1); err == nil {
		if again, err := t2.Render(vals2); err != nil || again != n1 {
			t.Fatalf("Values(%q) of template %q = %q, which renders %q (%v)", n1, t2.src, vals2, again, err)
		}
		if !compatible(shape1, templatePieces(t2, vals2)) {
			t.Fatalf("templates %q and %q render one name %q, from %q and %q", t1.src, t2.src, n1, vals, vals2)
		}
	}
	if n1 == n2 && !compatible(shape1, split(n2)) {
		t.Fatalf("templates %q and %q both render %q", t1.src, t2.src, n1)
	}
}

// The collisions of issue 23: a value that holds another template's separator.
func TestCrossTemplateCollisions(t *testing.T) {
	tests := []struct {
		t1, t2     string
		v1, v2     []string
		sameOrBoth bool // the templates may share names (a placeholder where the other has a word)
	}{
		{"repo:{Owner}", "repo:{Owner}/{Repo}", []string{"acme/x"}, []string{"acme", "x"}, false},
		{"digest:{Tenant}", "digest:{Tenant}:weekly", []string{"acme:weekly"}, []string{"acme"}, false},
		{"a:{x}", "a:{x}/{y}", []string{"p/q"}, []string{"p", "q"}, false},
		{"k:{x}", "k:{x} {y}", []string{"p q"}, []string{"p", "q"}, false},
		{"{x}", "{x}:b", []string{"a:b"}, []string{"a"}, false},
		{"u:{x}", "u:{x}@{y}", []string{"a@b"}, []string{"a", "b"}, false},
		{"h:{x}", "h:{x}→{y}", []string{"a→b"}, []string{"a", "b"}, false},
		// The rule's one exception: a placeholder where the other template has a literal word.
		{"tenant:{T}:import:{K}", "tenant:{T}:{U}:{K}", []string{"acme", "x"}, []string{"acme", "import", "x"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.t1+" "+tt.t2, func(t *testing.T) {
			t1, err := Parse(tt.t1)
			if err != nil {
				t.Fatal(err)
			}
			t2, err := Parse(tt.t2)
			if err != nil {
				t.Fatal(err)
			}
			n1, err := t1.Render(tt.v1)
			if err != nil {
				t.Fatal(err)
			}
			n2, err := t2.Render(tt.v2)
			if err != nil {
				t.Fatal(err)
			}
			if (n1 == n2) != tt.sameOrBoth {
				t.Fatalf("%q with %q renders %q, %q with %q renders %q", tt.t1, tt.v1, n1, tt.t2, tt.v2, n2)
			}
			checkPair(t, t1, t2, tt.v1, n2)
			checkPair(t, t2, t1, tt.v2, n1)
		})
	}
}

// Templates whose literal text gives a separator no value may hold, and values with the
// separators and words of the others, tried two templates at a time.
var (
	pairTemplates = []string{
		"{x}", "{x}:b", "{x}:{y}", "{x}/{y}", "{x}.{y}", "{x}-{y}", "{x}_{y}", "{x}~{y}", "{x} {y}",
		"a:{x}", "a:{x}:b", "a:{x}:{y}", "a:{x}/{y}", "a:{x}:b:{y}", "a:{x}::{y}", "a::{x}",
		"a:b:{x}", "a-b:{x}", "a.b:{x}", "a:{x}.b", "a:{x}/b", "a/{x}", "{{a:{x}}}:b", "{{a}}:{x}",
		"a→{x}", "a:{x}→{y}", "a:{x}é", "a:{x}:é", "a:{x}={y}&{z}", "a:{x}:{y}:{z}", "a b {x}",
		"repo:{Owner}", "repo:{Owner}/{Repo}", "digest:{Tenant}", "digest:{Tenant}:weekly",
		"digest:{Tenant}-weekly", "tenant:{T}:import:{K}", "tenant:{T}:{U}:{K}", "a{x}b{y}",
	}
	pairValues = []string{
		"b", "a", "é", "x", "a:b", "b:a", "a/b", "a.b", "a-b", "a_b", "a~b", "a b", "a::b", ":",
		"{a}", "a}:b", "%3A", "a%b", "a→b", "→", "weekly", "acme-weekly", "acme:weekly", "import",
		"-", ".", "a=b&c", "\x00", "\xff", "é:é",
	}
)

func TestTemplatePairs(t *testing.T) {
	var tmpls []*Template
	for _, src := range pairTemplates {
		if tmpl, err := Parse(src); err == nil {
			tmpls = append(tmpls, tmpl)
		}
	}
	pairs, names := 0, 0
	for _, t1 := range tmpls {
		for _, t2 := range tmpls {
			if slices.Equal(t1.lits, t2.lits) {
				continue // one shape: the same names for the same values
			}
			pairs++
			for i, a := range pairValues {
				for _, j := range []int{1, 7, 13} {
					b := pairValues[(i+j)%len(pairValues)]
					vals := tuple(len(t1.keys), a, b, pairValues[(i+5)%len(pairValues)])
					n2, _ := t2.Render(tuple(len(t2.keys), b, a))
					checkPair(t, t1, t2, vals, n2)
					names++
				}
			}
		}
	}
	t.Logf("%d templates, %d pairs of different templates, %d names tried", len(tmpls), pairs, names)
}

// FuzzCrossTemplate checks, for any two templates that parse and any values, that a name of
// one is a name of the other only as the rule allows, and that every name splits into its
// template's separators and words, one word per value.
func FuzzCrossTemplate(f *testing.F) {
	for i, s1 := range pairTemplates {
		s2 := pairTemplates[(i*7+3)%len(pairTemplates)]
		f.Add(s1, s2, pairValues[i%len(pairValues)], pairValues[(i+1)%len(pairValues)],
			pairValues[(i+2)%len(pairValues)], pairValues[(i+3)%len(pairValues)])
	}
	f.Add("repo:{Owner}", "repo:{Owner}/{Repo}", "acme/x", "", "acme", "x")
	f.Add("digest:{Tenant}", "digest:{Tenant}-weekly", "acme-weekly", "", "acme", "")
	f.Fuzz(func(t *testing.T, src1, src2, a, b, c, d string) {
		if len(src1)+len(src2)+len(a)+len(b)+len(c)+len(d) > 256 {
			return // long inputs find nothing short ones do not, and slow the fuzzer down
		}
		t1, err1 := Parse(src1)
		t2, err2 := Parse(src2)
		if err1 != nil || err2 != nil {
			return
		}
		n2, _ := t2.Render(tuple(len(t2.keys), c, d))
		checkPair(t, t1, t2, tuple(len(t1.keys), a, b), n2)
		n1, _ := t1.Render(tuple(len(t1.keys), a, b))
		checkPair(t, t2, t1, tuple(len(t2.keys), c, d), n1)
	})
}
