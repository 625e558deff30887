package docs

import (
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// stores are the packages of guard's backends: their package docs show how to make one.
var stores = []string{"memstore", "redisstore", "mongostore", "pgstore", "mysqlstore"}

// docsPath matches a path into the repository's docs directory.
var docsPath = regexp.MustCompile(`\bdocs/[\w-]+\.md\b`)

// What go doc shows of a package is all a reader of go doc has: each store's package doc
// shows a snippet that makes one, and no package doc sends the reader to a docs/ path, which
// go doc cannot follow (a link to the page on the repository's site can be).
func TestPackageDocs(t *testing.T) {
	repo := root(t)
	docs := packageDocs(t, repo)
	for _, store := range stores {
		d, ok := docs[store]
		if !ok {
			t.Errorf("%s has no package doc", store)
			continue
		}
		if !slices.ContainsFunc(d.Content, func(b comment.Block) bool { _, ok := b.(*comment.Code); return ok }) {
			t.Errorf("%s: the package doc shows no code", store)
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(docs)) {
		for _, text := range plainTexts(docs[pkg].Content) {
			for _, m := range docsPath.FindAllString(text, -1) {
				t.Errorf("%s: the package doc points at %s, which go doc cannot follow: link to "+
					"https://github.com/guardlock/guard/blob/main/%s, or say it", pkg, m, m)
			}
		}
	}
	if len(docs) < 15 {
		t.Errorf("found %d package docs", len(docs))
	}
}

// programModules are modules of their own whose package docs packageDocs reads with guard's:
// the example programs, which left guard's module only to keep etcd's client out of it.
var programModules = []string{"examples/worker", "examples/httpapi"}

// packageDocs returns the parsed package doc of every package of guard's module outside
// internal/, and of programModules, by directory relative to repo.
func packageDocs(t *testing.T, repo string) map[string]*comment.Doc {
	t.Helper()
	docs := map[string]*comment.Doc{}
	err := filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(repo, path)
		if rel != "." {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "internal" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && !slices.Contains(programModules, filepath.ToSlash(rel)) {
				return filepath.SkipDir // a module of its own
			}
		}
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, path, func(fi fs.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		for _, pkg := range pkgs {
			var text strings.Builder
			for _, f := range pkg.Files {
				if f.Doc != nil {
					text.WriteString(f.Doc.Text())
				}
			}
			if text.Len() > 0 {
				docs[filepath.ToSlash(rel)] = new(comment.Parser).Parse(text.String())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// plainTexts returns the texts of blocks that a reader cannot follow: plain and italic text,
// and code; not links, which go doc lists with their URLs.
func plainTexts(blocks []comment.Block) []string {
	var out []string
	texts := func(ts []comment.Text) {
		for _, t := range ts {
			switch t := t.(type) {
			case comment.Plain:
				out = append(out, string(t))
			case comment.Italic:
				out = append(out, string(t))
			}
		}
	}
	for _, b := range blocks {
		switch b := b.(type) {
		case *comment.Paragraph:
			texts(b.Text)
		case *comment.Heading:
			texts(b.Text)
		case *comment.Code:
			out = append(out, b.Text)
		case *comment.List:
			for _, item := range b.Items {
				out = append(out, plainTexts(item.Content)...)
			}
		}
	}
	return out
}
