package docs

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// Every relative link of every Markdown page of the repository — README, CHANGELOG, docs/ —
// leads to a file or directory that exists, and its anchor, if any, to a heading of that page.
func TestLinks(t *testing.T) {
	repo := root(t)
	pages := markdownPages(t, repo)
	if len(pages) < 5 {
		t.Fatalf("found %d Markdown pages: %v", len(pages), pages)
	}
	for _, page := range pages {
		for _, problem := range brokenLinks(repo, page) {
			t.Error(problem)
		}
	}
}

// The checker finds what it must: a missing file, a missing anchor in another page and in the
// page itself; and takes what GitHub takes, headings with code, punctuation and repeats.
func TestLinkChecker(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/ops.md", "# Ops\n\n## Clocks\n\n## `guardctl`: list, show\n\n## Clocks\n\n```sh\n## not a heading\n```\n")
	write("README.md", strings.Join([]string{
		"[ok](docs/ops.md) [ok](docs/ops.md#clocks) [ok](docs/ops.md#clocks-1) [ok](docs/ops.md#guardctl-list-show)",
		"[ok](docs/) [ok](#readme) ![ok](docs/ops.md) [ok](https://example.com/x#y) `[not a link](nowhere.md)`",
		"[gone](docs/missing.md) [gone](docs/ops.md#clock-skew) [gone](#nowhere) [gone](docs/ops.md#not-a-heading)",
		"# Readme",
		"```",
		"[not a link](nowhere.md)",
		"```",
		"[ref]: docs/other.md",
	}, "\n"))
	got := brokenLinks(dir, filepath.Join(dir, "README.md"))
	want := []string{"docs/missing.md", "docs/ops.md#clock-skew", "#nowhere", "docs/ops.md#not-a-heading", "docs/other.md"}
	if len(got) != len(want) {
		t.Fatalf("found %d broken links, want %d: %q", len(got), len(want), got)
	}
	for i, w := range want {
		if !strings.Contains(got[i], "("+w+")") {
			t.Errorf("problem %d is %q, want one about %s", i, got[i], w)
		}
	}
}

// markdownPages returns the Markdown files of the repository under repo, but those of tool
// modules' dependencies and of hidden directories.
func markdownPages(t *testing.T, repo string) []string {
	t.Helper()
	var pages []string
	err := filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != repo && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			pages = append(pages, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an optional title.
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refDef matches a reference definition: [label]: target.
	refDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	// codeSpan matches an inline code span.
	codeSpan = regexp.MustCompile("`+[^`]*`+")
	// heading matches an ATX heading.
	heading = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	// htmlAnchor matches an id or name attribute, an anchor of its own.
	htmlAnchor = regexp.MustCompile(`\b(?:id|name)="([^"]+)"`)
)

// prose returns the lines of a Markdown page outside fenced code blocks, by line number
// (from 1).
func prose(content string) map[int]string {
	lines := map[int]string{}
	fence := ""
	for i, line := range strings.Split(content, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
		case fence != "" && strings.HasPrefix(trimmed, fence):
			fence = ""
		case fence == "":
			lines[i+1] = line
		}
	}
	return lines
}

// brokenLinks returns a line for each relative link of page (a path under repo) that does not
// resolve: its target is missing, or its anchor names no heading of the target page.
func brokenLinks(repo, page string) []string {
	content, err := os.ReadFile(page)
	if err != nil {
		return []string{err.Error()}
	}
	rel, _ := filepath.Rel(repo, page)
	lines := prose(string(content))
	var problems []string
	for _, n := range slices.Sorted(maps.Keys(lines)) {
		line := codeSpan.ReplaceAllString(lines[n], "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, target := range targets {
			if problem := checkTarget(page, target); problem != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: (%s) %s", rel, n, target, problem))
			}
		}
	}
	return problems
}

// checkTarget returns what is wrong with the link target on page, or "".
func checkTarget(page, target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return ""
	}
	path, anchor, _ := strings.Cut(target, "#")
	file := page
	if path != "" {
		file = filepath.Join(filepath.Dir(page), filepath.FromSlash(path))
		if _, err := os.Stat(file); err != nil {
			return "no such file or directory"
		}
	}
	if anchor == "" {
		return ""
	}
	if !strings.HasSuffix(file, ".md") {
		return "an anchor in a file that is not a Markdown page"
	}
	content, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	if !slices.Contains(anchors(string(content)), anchor) {
		return "no heading with this anchor"
	}
	return ""
}

// anchors returns the anchors of a Markdown page as GitHub makes them: one per heading, its
// text lower-cased, without punctuation, spaces turned into hyphens, and -1, -2… after a
// repeat; and the id and name attributes of its HTML.
func anchors(content string) []string {
	lines := prose(content)
	seen := map[string]int{}
	var out []string
	for _, n := range slices.Sorted(maps.Keys(lines)) {
		line := lines[n]
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := slugify(m[2])
		if k := seen[slug]; k > 0 {
			out = append(out, slug+"-"+strconv.Itoa(k))
		} else {
			out = append(out, slug)
		}
		seen[slug]++
	}
	return out
}

// slugify turns a heading's Markdown into its anchor: links become their text, and what is
// not a letter, a mark, a digit, an underscore, a space or a hyphen goes.
func slugify(text string) string {
	text = inlineLink.ReplaceAllStringFunc(text, func(link string) string {
		start, end := strings.Index(link, "["), strings.LastIndex(link, "](")
		return link[start+1 : end]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) || r == '_' || r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}
