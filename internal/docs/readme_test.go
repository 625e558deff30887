package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// quickStartBlock matches the first Go block under the README's "## Quick start".
var quickStartBlock = regexp.MustCompile("(?s)\n## Quick start\n[^#]*?```go\n(.*?)```")

// The README's quick start, pasted whole into the main.go of a fresh module, passes go vet
// and builds: it is a program, not a fragment. It takes the lock's fence inside the locked
// code, and creates the table of the SQL store it shows.
func TestREADMEQuickStart(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := quickStartBlock.FindSubmatch(readme)
	if m == nil {
		t.Fatal(`README.md has no Go block under "## Quick start"`)
	}
	src := string(m[1])
	for _, want := range []string{"package main", "guard.FromContext(", ".Fence()", ".CreateTable(ctx)"} {
		if !strings.Contains(src, want) {
			t.Errorf("the quick start does not show %s", want)
		}
	}
	dir := tempModule(t, "example.com/quickstart")
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	goIn(t, dir, "vet", ".")
	goIn(t, dir, "build", "-o", os.DevNull, ".")
}
