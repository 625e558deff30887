package docs

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Every command a page shows exists as shown: the scripts and programs it runs, the packages
// and directories it names, the flags it passes to our programs, and the environment
// variables it sets, which the code must read.
func TestCommands(t *testing.T) {
	repo := root(t)
	var all []command
	for _, page := range markdownPages(t, repo) {
		all = append(all, pageCommands(t, repo, page)...)
	}
	if len(all) < 10 {
		t.Fatalf("found %d commands in the pages", len(all))
	}
	env := envNames(t, repo)
	for _, c := range all {
		if problem := checkCommand(t, repo, c, env); problem != "" {
			t.Errorf("%s: %s: %s", c.where, strings.Join(c.words, " "), problem)
		}
	}
}

// The checker finds what it must: a script that is not there, an unknown flag, a variable
// nobody reads, a package that does not exist.
func TestCommandChecker(t *testing.T) {
	repo := root(t)
	env := envNames(t, repo)
	for _, tt := range []struct {
		line string
		bad  bool
	}{
		{"./scripts/test-all", false},
		{"GUARD_DOCS_DIR=docs ./scripts/update-docs", true},
		{"GUARD_DOCS_DIR=$PWD/docs go test -count=1 -run TestJaeger ./internal/e2e/", false},
		{"GUARD_NO_SUCH_VARIABLE=1 go test ./pgstore/", true},
		{"cd examples/httpapi && go run . -trace-stdout -wait 10s", false},
		{"cd examples/httpapi && go run . -no-such-flag", true},
		{"cd examples/worker && go run . -etcd 127.0.0.1:2379", false},
		{"go run ./examples/worker", true}, // a module of its own
		{"cd examples/worker && go run ./examples/worker", true},
		{"go run ./examples/nowhere", true},
		{"cd tools/jaeger && go build -o jaeger github.com/jaegertracing/jaeger/cmd/jaeger && ./jaeger &", false},
		{"cd tools/jaeger && go build github.com/nowhere/nothing", true},
		{"guardctl -backend redis://x list report:", false},
		{"guardctl lsit", true},
		{"go install github.com/guardlock/guard/cmd/guardctl@latest", true}, // replace directives
		{"cd cmd/guardctl && go install .", false},
		{"go build ./cmd/guardctl", true}, // a module of its own
		{"go test ./etcdstore/", true},
		{"cd etcdstore && go test -run TestConformance .", false},
		{"go test ./pgstore/", false},
		{"go install github.com/guardlock/guard/cmd/nothing@latest", true},
		{"frobnicate --all", true},
	} {
		cmds := parseScript("test", tt.line)
		var problems []string
		for _, c := range cmds {
			if p := checkCommand(t, repo, c, env); p != "" {
				problems = append(problems, p)
			}
		}
		if bad := len(problems) > 0; bad != tt.bad {
			t.Errorf("%s: problems %q, want a problem: %v", tt.line, problems, tt.bad)
		}
	}
}

// command is one simple command of a shell block on a page.
type command struct {
	where string   // page:line
	dir   string   // where it runs, relative to the repository's root: "" or after a cd
	env   []string // the names of the variables it sets (VAR=value words before it)
	words []string // the command and its arguments, unquoted
	built []string // files that go build -o made earlier on the line
}

// block is a fenced code block of a page.
type block struct {
	lang string // the info string's first word: "sh", "go", "" …
	line int    // of the block's first line, from 1
	body string
}

// codeBlocks returns the fenced code blocks of a Markdown page.
func codeBlocks(content string) []block {
	var out []block
	var cur *block
	var body strings.Builder
	fence := ""
	for i, line := range strings.Split(content, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case cur == nil && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			lang, _, _ := strings.Cut(strings.TrimSpace(trimmed[3:]), " ")
			cur = &block{lang: lang, line: i + 2}
			body.Reset()
		case cur != nil && strings.HasPrefix(trimmed, fence):
			cur.body = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line + "\n")
		}
	}
	return out
}

// shellLangs are the info strings of blocks of shell commands.
var shellLangs = []string{"sh", "bash", "shell", "console"}

// pageCommands returns the commands of page: every line of its sh, bash and shell blocks,
// and the lines that start with a "$ " prompt in its other blocks but Go's.
func pageCommands(t *testing.T, repo, page string) []command {
	t.Helper()
	content, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(repo, page)
	var out []command
	for _, b := range codeBlocks(string(content)) {
		body := b.body
		switch {
		case b.lang == "go" || b.lang == "sql":
			continue
		case !slices.Contains(shellLangs, b.lang) || b.lang == "console":
			var prompted []string
			for _, l := range strings.Split(body, "\n") {
				cmd, _ := strings.CutPrefix(l, "$ ")
				if cmd == l {
					cmd = ""
				}
				prompted = append(prompted, cmd)
			}
			body = strings.Join(prompted, "\n")
		}
		out = append(out, parseScript(fmt.Sprintf("%s:%d", rel, b.line), body)...)
	}
	// Commands in the prose, as code spans: `go test ./pgstore/`.
	lines := prose(string(content))
	for _, n := range slices.Sorted(maps.Keys(lines)) {
		for _, m := range inlineCommand.FindAllStringSubmatch(lines[n], -1) {
			out = append(out, parseScript(fmt.Sprintf("%s:%d", rel, n), m[1])...)
		}
	}
	return out
}

// inlineCommand matches a code span that holds a command: the go command's, guardctl's, or a
// path's, after variable assignments.
var inlineCommand = regexp.MustCompile("`((?:[A-Z_][A-Z0-9_]*=\\S+ )*(?:go (?:run|test|build|install|get|vet) |guardctl |\\./)[^`]*)`")

// parseScript splits a shell script into simple commands: lines joined at a trailing
// backslash, comments dropped, and split at ;, &, &&, || and |. A cd applies to the rest of
// its line; for, do, done and wait are the script's own.
func parseScript(where, script string) []command {
	script = strings.ReplaceAll(script, "\\\n", " ")
	base, _, _ := strings.Cut(where, ":")
	first := 0
	if _, n, ok := strings.Cut(where, ":"); ok {
		fmt.Sscan(n, &first)
	}
	var out []command
	for i, line := range strings.Split(script, "\n") {
		dir := ""
		var built []string
		for _, seg := range splitCommands(line) {
			words := shellWords(seg)
			var env []string
			for len(words) > 0 && isAssignment(words[0]) {
				name, _, _ := strings.Cut(words[0], "=")
				env = append(env, name)
				words = words[1:]
			}
			if len(words) > 0 && (words[0] == "do" || words[0] == "then") {
				words = words[1:]
			}
			if len(words) == 0 {
				continue
			}
			if words[0] == "export" { // export VAR=value: the variables are what to check
				for _, w := range words[1:] {
					name, _, _ := strings.Cut(w, "=")
					env = append(env, name)
				}
				words = words[:1]
			}
			switch words[0] {
			case "for", "done", "wait", "fi":
				continue
			case "cd":
				if len(words) > 1 {
					dir = filepath.Join(dir, words[1])
				}
			}
			c := command{where: fmt.Sprintf("%s:%d", base, first+i), dir: dir, env: env, words: words, built: slices.Clone(built)}
			if len(words) > 3 && words[0] == "go" && words[1] == "build" {
				if o := slices.Index(words, "-o"); o > 0 && o+1 < len(words) {
					built = append(built, filepath.Join(dir, words[o+1]))
				}
			}
			out = append(out, c)
		}
	}
	return out
}

// isAssignment reports whether word is a VAR=value prefix.
func isAssignment(word string) bool {
	name, _, ok := strings.Cut(word, "=")
	return ok && regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`).MatchString(name)
}

// splitCommands splits a line at the shell's command separators outside quotes and $(…),
// and drops its comment.
func splitCommands(line string) []string {
	var out []string
	var cur strings.Builder
	quote, depth := byte(0), 0
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '$' && i+1 < len(line) && line[i+1] == '(':
			depth++
		case c == ')' && depth > 0:
			depth--
		case depth > 0:
		case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return append(out, cur.String())
		case c == ';' || c == '&' || c == '|':
			out = append(out, cur.String())
			cur.Reset()
			if i+1 < len(line) && (line[i+1] == '&' || line[i+1] == '|') {
				i++
			}
			continue
		}
		cur.WriteByte(c)
	}
	return append(out, cur.String())
}

// shellWords splits a command into words, removing quotes; $(…) stays inside its word.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in, quote, depth := false, byte(0), 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
				continue
			}
		case c == '\'' || c == '"':
			quote, in = c, true
			continue
		case c == '$' && i+1 < len(s) && s[i+1] == '(':
			depth++
		case c == ')' && depth > 0:
			depth--
		case depth == 0 && (c == ' ' || c == '\t'):
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
			continue
		}
		cur.WriteByte(c)
		in = true
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// utilities are the programs other than ours that pages may run.
var utilities = []string{"apt-get", "curl", "date", "echo", "export", "jq", "kill", "sleep", "sudo"}

// checkCommand returns what is wrong with c, or "".
func checkCommand(t *testing.T, repo string, c command, env map[string]bool) string {
	for _, name := range c.env {
		if !env[name] && !strings.HasPrefix(name, "OTEL_") {
			return fmt.Sprintf("no code reads %s", name)
		}
	}
	dir := filepath.Join(repo, c.dir)
	if info, err := os.Stat(dir); err != nil || !info.IsDir() {
		return fmt.Sprintf("no directory %s", c.dir)
	}
	name, args := c.words[0], c.words[1:]
	switch {
	case name == "cd":
		return "" // checked above, as the next command's directory
	case name == "go":
		return checkGo(t, repo, dir, args)
	case name == "guardctl":
		return checkFlags(t, "cmd/guardctl", args, true)
	case strings.HasPrefix(name, "./"):
		path := filepath.Join(dir, name)
		if slices.Contains(c.built, filepath.Join(c.dir, name)) {
			return ""
		}
		info, err := os.Stat(path)
		switch {
		case err != nil:
			return fmt.Sprintf("no %s in %s", name, filepath.Join("/", c.dir))
		case info.Mode()&0o111 == 0:
			return fmt.Sprintf("%s is not executable", name)
		}
		return ""
	case slices.Contains(utilities, name):
		return ""
	}
	return fmt.Sprintf("unknown program %q: a page may run go, guardctl, a program of the repository, and %v", name, utilities)
}

// goFlagsWithValues are the go command's flags that take the next word as their value.
var goFlagsWithValues = []string{"-o", "-run", "-bench", "-benchtime", "-timeout", "-count", "-p", "-tags", "-C"}

// checkGo returns what is wrong with the go command run with args in dir, or "".
func checkGo(t *testing.T, repo, dir string, args []string) string {
	if len(args) == 0 {
		return "go without a command"
	}
	sub, args := args[0], args[1:]
	var pkgs []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			if slices.Contains(goFlagsWithValues, a) {
				i++
			}
			continue
		}
		pkgs = append(pkgs, a)
		if sub == "run" {
			// The rest are the program's arguments.
			rel, err := filepath.Rel(repo, filepath.Join(dir, a))
			if err != nil {
				return err.Error()
			}
			if problem := checkPackage(repo, dir, a); problem != "" {
				return problem
			}
			if _, ok := programFlags[filepath.ToSlash(rel)]; ok {
				return checkFlags(t, filepath.ToSlash(rel), args[i+1:], false)
			}
			return ""
		}
	}
	switch sub {
	case "get", "install", "build", "test", "vet":
		for _, p := range pkgs {
			if problem := checkPackage(repo, dir, p); problem != "" {
				return problem
			}
		}
	case "mod", "env", "version", "doc", "list", "work", "generate", "tool":
	default:
		return fmt.Sprintf("unknown go command %q", sub)
	}
	return ""
}

// checkPackage returns what is wrong with the package pattern p, given to the go command in
// dir, or "": a relative one must be a directory with Go files; one of guard's must be a
// directory of the repository; another must come from a module of dir's go.mod. A package of
// one of the repository's modules (guard, cmd/guardctl, etcdstore …) is built from that
// module: a relative pattern or a path without a version must not cross into another one,
// and `go install path@version` refuses a module whose go.mod has replace directives.
func checkPackage(repo, dir, p string) string {
	p, _, versioned := strings.Cut(p, "@")
	p = strings.TrimSuffix(strings.TrimSuffix(p, "/..."), "/")
	const guardPath = "github.com/guardlock/guard"
	switch {
	case p == "." || strings.HasPrefix(p, "./") || strings.HasPrefix(p, "../"):
		target := filepath.Join(dir, p)
		if !hasGoFiles(target) {
			return fmt.Sprintf("no Go package %s in %s", p, dir)
		}
		if mod := moduleDir(repo, target); mod != moduleDir(repo, dir) {
			return fmt.Sprintf("%s is in the module of %s: cd there first", p, relTo(repo, mod))
		}
	case p == guardPath || strings.HasPrefix(p, guardPath+"/"):
		target := filepath.Join(repo, strings.TrimPrefix(strings.TrimPrefix(p, guardPath), "/"))
		if !hasGoFiles(target) {
			return fmt.Sprintf("guard has no package %s", p)
		}
		mod := moduleDir(repo, target)
		switch {
		case versioned && hasReplace(mod):
			return fmt.Sprintf("the go.mod of %s has replace directives, which go install with a version refuses: "+
				"from a checkout, cd %s && go install .", relTo(repo, mod), relTo(repo, target))
		case !versioned && mod != moduleDir(repo, dir):
			return fmt.Sprintf("%s is in the module of %s: cd there first", p, relTo(repo, mod))
		}
	default:
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return fmt.Sprintf("%s: no go.mod in %s to find it in", p, dir)
		}
		for _, f := range strings.Fields(string(gomod)) {
			if f != "" && (p == f || strings.HasPrefix(p, f+"/")) {
				return ""
			}
		}
		return fmt.Sprintf("the go.mod of %s requires no module that provides %s", dir, p)
	}
	return ""
}

// moduleDir returns the directory of the go.mod of the module that holds path, a directory
// of the repository.
func moduleDir(repo, path string) string {
	for d := filepath.Clean(path); ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil || d == repo || d == filepath.Dir(d) {
			return d
		}
	}
}

// hasReplace reports whether the go.mod in dir has a replace directive.
func hasReplace(dir string) bool {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	return err == nil && replaceDirective.Match(gomod)
}

var replaceDirective = regexp.MustCompile(`(?m)^replace\b`)

// relTo returns path relative to the repository's root, "." for the root.
func relTo(repo, path string) string {
	rel, err := filepath.Rel(repo, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(rel)
}

// hasGoFiles reports whether dir holds a .go file, directly or below (for a /... pattern).
func hasGoFiles(dir string) bool {
	found := false
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") {
			found = true
			return filepath.SkipAll
		}
		return err
	})
	return found
}

// programFlags are the flags of the programs whose command lines pages show, by package, as
// their -h says: name → whether it takes a value. Commands are guardctl's subcommands.
var programFlags = map[string]*usage{"examples/worker": {}, "examples/httpapi": {}, "cmd/guardctl": {}}

// usage is what a program's -h says.
type usage struct {
	once     sync.Once
	flags    map[string]bool // name → takes a value
	commands []string
	err      error
}

var (
	usageFlag    = regexp.MustCompile(`(?m)^\s+-([a-zA-Z][\w-]*)(?: (\S+))?\s*$`)
	usageCommand = regexp.MustCompile(`(?m)^  ([a-z]+) `)
)

// programUsage returns what the program in pkg says when run with -h.
func programUsage(t *testing.T, pkg string) *usage {
	t.Helper()
	u := programFlags[pkg]
	bin := program(t, pkg)
	u.once.Do(func() {
		out, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits 0 or 2, as flag packages do
		u.flags = map[string]bool{}
		for _, m := range usageFlag.FindAllStringSubmatch(string(out), -1) {
			u.flags[m[1]] = m[2] != ""
		}
		if len(u.flags) == 0 {
			u.err = fmt.Errorf("%s -h lists no flags:\n%s", pkg, out)
		}
		if _, after, ok := strings.Cut(string(out), "commands:\n"); ok {
			block, _, _ := strings.Cut(after, "\n\n")
			for _, m := range usageCommand.FindAllStringSubmatch(block+"\n", -1) {
				u.commands = append(u.commands, m[1])
			}
		}
	})
	if u.err != nil {
		t.Fatal(u.err)
	}
	return u
}

// checkFlags returns what is wrong with the arguments args of the program in pkg, or "":
// every flag must be one it has; with subcommands, the first other word must be one.
func checkFlags(t *testing.T, pkg string, args []string, subcommands bool) string {
	u := programUsage(t, pkg)
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			if subcommands && !slices.Contains(u.commands, a) {
				return fmt.Sprintf("%s has no command %q (it has %v)", pkg, a, u.commands)
			}
			return "" // the command's own arguments follow, or the program's
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takes, ok := u.flags[name]
		switch {
		case name == "h" || name == "help":
		case !ok:
			return fmt.Sprintf("%s has no flag -%s", pkg, name)
		case takes && !hasValue:
			i++
		}
	}
	return ""
}

// envNames returns the names of the environment variables the repository's Go code reads:
// every string literal that is a name in capitals and digits, as os.Getenv takes it.
func envNames(t *testing.T, repo string) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)"`)
	names := map[string]bool{}
	err := filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != repo && (strings.HasPrefix(d.Name(), ".") || path == filepath.Join(repo, "internal", "docs")) {
			return filepath.SkipDir // and not this package, whose tests name variables that do not exist
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}
