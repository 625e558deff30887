package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"golang.org/x/term"

	"github.com/guardlock/guard"
)

// Defaults of the flags.
const (
	defaultTimeout  = 5 * time.Second
	defaultInterval = time.Second
	// backendEnv names the environment variable that gives the backend URL when -backend
	// does not: it keeps a password off the command line, where ps shows it.
	backendEnv = "GUARDCTL_BACKEND"
)

// pageSize is how many locks list and watch ask the backend for per request.
const pageSize = 500

func main() {
	// The drivers print some failures themselves; guardctl reports each one once, as its
	// error on one line.
	redis.SetLogger(quietLogger{})
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// quietLogger drops go-redis's log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// run is the command: it parses args, runs one subcommand and returns the exit status — 0 on
// success (and for -h), 1 when the subcommand fails, 2 for a mistake in the command line. Every
// failure is one line on stderr. Cancelling ctx (an interrupt) ends watch with status 0 and
// makes any other subcommand fail.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runWith(ctx, func(ctx context.Context, b *backend) (guard.Inspector, func(), error) { return b.open(ctx) },
		args, stdin, stdout, stderr)
}

// runWith is run with open as the function that connects to the backend: tests give one that
// returns a store of their own.
func runWith(ctx context.Context, open opener, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := cli{open: open}
	fs := c.flags()
	err := c.run(ctx, fs, args, stdin, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage(fs))
		return 0
	}
	msg := c.message(err)
	if u := (usageError{}); errors.As(err, &u) {
		fmt.Fprintf(stderr, "guardctl: %s (guardctl -h for usage)\n", msg)
		return 2
	}
	fmt.Fprintf(stderr, "guardctl: %s\n", msg)
	return 1
}

// cli is one run of the command: its flags, its streams and the store it inspects.
type cli struct {
	backendURL, prefix string
	json, yes, force   bool
	interval, timeout  time.Duration

	stdin          io.Reader
	stdout, stderr io.Writer
	loc            *time.Location // for the times printed

	open    opener // connects to backend
	backend *backend
	store   guard.Inspector
}

// message returns err as guardctl prints it: on one line, whatever a driver says. It holds no
// secret: guardctl names the backend by its URL with the secrets hidden (backend.url), and
// gives a driver's parse error only for that URL (backend.driverParse).
func (c *cli) message(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// opener connects to a parsed backend and returns its store, and a function that closes what
// it opened.
type opener func(ctx context.Context, b *backend) (guard.Inspector, func(), error)

// flags returns the command's flag set, bound to c.
func (c *cli) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("guardctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run reports a bad flag in its own one line
	// No default from the environment here: -h would print it, password and all.
	fs.StringVar(&c.backendURL, "backend", "", "the backend's `URL` or DSN (default $"+backendEnv+")")
	fs.StringVar(&c.prefix, "prefix", "", "the Redis key `prefix` of the store (redisstore.WithPrefix; default \"guard:\")")
	fs.BoolVar(&c.json, "json", false, "print JSON: an array for list, an object for show and release, an array per line for watch")
	fs.BoolVar(&c.yes, "yes", false, "release without asking for confirmation")
	fs.BoolVar(&c.force, "force", false, "release whoever holds the name when the release reaches the backend, not only the holder shown (exit status 1 when that is another)")
	fs.DurationVar(&c.interval, "interval", defaultInterval, "how often watch refreshes")
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "how long one request to the backend may take, connecting included")
	return fs
}

// usage is what -h prints.
func usage(fs *flag.FlagSet) string {
	var flags bytes.Buffer
	fs.SetOutput(&flags)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	return `usage: guardctl [flags] command [argument]

Inspect and force-release the locks of a guard backend.

commands:
  list [prefix]   the held locks whose names start with prefix (all without one)
  show NAME       one lock: its holder, or "free" with its last fence
  release NAME    free NAME if it is still held by the holder shown (asks first unless
                  -yes); with -force, whoever holds it
  watch [prefix]  list again every -interval until interrupted

flags (before the command):
` + flags.String() + `
` + urlForms() + `

exit status: 0 done, 1 failed (backend unreachable, name not held, …), 2 bad command line.
`
}

// run parses args and runs the subcommand they name.
func (c *cli) run(ctx context.Context, fs *flag.FlagSet, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c.stdin, c.stdout, c.stderr, c.loc = stdin, stdout, stderr, time.Local
	if err := checkArgs(fs, args); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	args = fs.Args()
	if len(args) == 0 {
		return usagef("no command: list, show, release or watch")
	}
	cmd, args := args[0], args[1:]
	for i, a := range args {
		if a == "--" { // the end of the flags: the rest are names, even those that start with '-'
			args = slices.Delete(args, i, i+1)
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case name == "h" || name == "help":
			return flag.ErrHelp
		case fs.Lookup(name) != nil:
			return usagef("flags go before the command: guardctl %s %s … (a name that starts with '-' goes after --: guardctl %s -- %s)",
				a, cmd, cmd, a)
		}
	}
	var want string // the arguments cmd takes, for its usage error
	switch cmd {
	case "list", "watch":
		if len(args) > 1 {
			want = "[prefix]"
		}
	case "show", "release":
		if len(args) != 1 {
			want = "NAME"
		}
	default:
		return usagef("unknown command %q: list, show, release or watch", cmd)
	}
	if want != "" {
		return usagef("%s takes %s, not %d arguments: guardctl [flags] %s %s", cmd, want, len(args), cmd, want)
	}
	if c.timeout <= 0 {
		return usagef("-timeout must be positive")
	}
	if c.interval <= 0 {
		return usagef("-interval must be positive")
	}
	var prefix *string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "prefix" {
			prefix = &c.prefix
		}
	})
	if c.backendURL == "" {
		c.backendURL = os.Getenv(backendEnv)
	}
	var err error
	if c.backend, err = parseBackend(c.backendURL, prefix, c.timeout); err != nil {
		return err
	}
	store, closeStore, err := c.open(ctx, c.backend)
	if err != nil {
		return err
	}
	defer closeStore()
	c.store = store

	arg := ""
	if len(args) > 0 {
		arg = args[0]
	}
	switch cmd {
	case "list":
		return c.list(ctx, arg)
	case "show":
		return c.show(ctx, arg)
	case "release":
		return c.release(ctx, arg)
	default:
		return c.watch(ctx, arg)
	}
}

// checkArgs refuses a command line that holds a backend URL or DSN with a secret anywhere but
// as the value of -backend: in the wrong place — a flag's value, the command, a lock name, or
// after a mistyped flag — the usage errors of the flag package and of the command would quote
// it as it is. The message shows it with its secrets hidden. The arguments after the
// command's "--" are names, taken as they are.
func checkArgs(fs *flag.FlagSet, args []string) error {
	flags := true // still before the command
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			if !flags {
				return nil
			}
			flags = false
			continue
		}
		trimmed := strings.TrimLeft(a, "-")
		name, value, hasValue := strings.Cut(trimmed, "=")
		if flags && len(a) > 1 && a[0] == '-' {
			f := fs.Lookup(name)
			takesNext := !hasValue && f != nil && !isBoolFlag(f)
			switch {
			case name == "backend" && takesNext:
				i++ // its value: where a backend belongs
				continue
			case name == "backend":
				continue
			case takesNext && i+1 < len(args):
				i++
				if err := slip(args[i], i+1); err != nil {
					return err
				}
			}
		} else {
			flags = false
		}
		for _, s := range []string{a, trimmed, value} {
			if err := slip(s, i+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// slip returns a usage error when arg, the n-th argument, is a backend URL or DSN that holds
// a secret, or one that guardctl cannot take apart.
func slip(arg string, n int) error {
	f := formOf(arg)
	if f == nil {
		return nil
	}
	shown := f.label(arg)
	if c, err := f.split(arg); err == nil {
		if !c.secrets() {
			return nil
		}
		shown = c.render(true)
	}
	return usagef("argument %d is a backend URL or DSN with a password (%s): give it as the value of -backend, "+
		"before the command, or in $%s (a lock name that looks like one goes after --)", n, shown, backendEnv)
}

// isBoolFlag reports whether f is a boolean flag, which takes no separate value.
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// call runs one request to the backend under -timeout, and says in its error which operation
// failed and on which backend.
func (c *cli) call(ctx context.Context, op string, f func(context.Context) error) error {
	deadline := time.Now().Add(c.timeout)
	reqCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := f(reqCtx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, guard.ErrNotHeld), errors.Is(err, guard.ErrChangedHands):
		return fmt.Errorf("%s: %w", op, err)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: interrupted: %w", op, ctx.Err())
	case !time.Now().Before(deadline): // a driver's I/O deadline may come before reqCtx's
		if dialErr := c.backend.dials.lastError(); dialErr != nil {
			return fmt.Errorf("%s: %s: no answer within %v (-timeout): %w; last error: %w", op, c.backend.url, c.timeout, err, dialErr)
		}
		return fmt.Errorf("%s: %s: no answer within %v (-timeout): %w", op, c.backend.url, c.timeout, err)
	}
	return fmt.Errorf("%s: %s: %w", op, c.backend.url, err)
}

// listAll returns the held locks whose names start with prefix, sorted by name. It pages
// through the store until it says there is no more, and keeps the first of repeats: Redis
// SCAN returns a name again when the server resizes its key table between pages.
func (c *cli) listAll(ctx context.Context, prefix string) ([]guard.LockInfo, error) {
	op := "list"
	if prefix != "" {
		op += " " + text(prefix)
	}
	return listPages(ctx, func(ctx context.Context, cursor string) (page []guard.LockInfo, next string, err error) {
		err = c.call(ctx, op, func(ctx context.Context) error {
			page, next, err = c.store.List(ctx, prefix, cursor, pageSize)
			return err
		})
		return page, next, err
	})
}

// listPages collects the pages that list returns, from the first (cursor "") to the one whose
// next cursor is "", drops repeated names and sorts the locks by name.
func listPages(ctx context.Context, list func(ctx context.Context, cursor string) ([]guard.LockInfo, string, error)) ([]guard.LockInfo, error) {
	var (
		locks  []guard.LockInfo
		seen   = make(map[string]bool)
		cursor string
	)
	for {
		page, next, err := list(ctx, cursor)
		if err != nil {
			return nil, err
		}
		for _, l := range page {
			if !seen[l.Name] {
				seen[l.Name] = true
				locks = append(locks, l)
			}
		}
		if next == "" {
			break
		}
		if next == cursor {
			return nil, fmt.Errorf("list: the backend returned cursor %q again: it would never end", next)
		}
		cursor = next
	}
	slices.SortFunc(locks, func(a, b guard.LockInfo) int { return strings.Compare(a.Name, b.Name) })
	return locks, nil
}

func (c *cli) list(ctx context.Context, prefix string) error {
	locks, err := c.listAll(ctx, prefix)
	if err != nil {
		return err
	}
	return c.printLocks(c.stdout, locks, prefix)
}

// printLocks writes locks as list prints them.
func (c *cli) printLocks(w io.Writer, locks []guard.LockInfo, prefix string) error {
	switch {
	case c.json:
		return writeJSON(w, locksJSON(locks))
	case len(locks) == 0 && prefix != "":
		_, err := fmt.Fprintf(w, "no lock held whose name starts with %q\n", prefix)
		return err
	case len(locks) == 0:
		_, err := fmt.Fprintln(w, "no lock held")
		return err
	}
	return writeTable(w, locks, c.loc)
}

func (c *cli) inspect(ctx context.Context, op, name string) (info guard.LockInfo, err error) {
	err = c.call(ctx, op+" "+text(name), func(ctx context.Context) error {
		info, err = c.store.Inspect(ctx, name)
		return err
	})
	return info, err
}

func (c *cli) show(ctx context.Context, name string) error {
	info, err := c.inspect(ctx, "show", name)
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, toJSON(info))
	}
	return writeLock(c.stdout, info, time.Now(), c.loc)
}

// release force-releases name. It inspects name first: to refuse a free name, to show the
// operator what they are about to break, and to print what it broke. It then releases that
// lock and no other: the store frees the name only while it is held with the fence shown, in
// one atomic step, so that a lock taken meanwhile — while the operator read the question, or
// between the look and the release — survives, and release says what holds the name now.
//
// With -force a name that changed hands is freed all the same: release looks again and frees
// the holder it finds, again by its fence, so that it can say which lock it broke; it prints
// that lock, and exits 1 because it was not the one shown. A shared name shown with several
// holders loses all of them (ForceRelease with fence 0).
func (c *cli) release(ctx context.Context, name string) error {
	op := "release " + text(name)
	info, err := c.inspect(ctx, "release", name)
	if err != nil {
		return err
	}
	if !info.Held {
		return fmt.Errorf("%s: %w", op, guard.ErrNotHeld)
	}
	if !c.yes {
		if !isTerminal(c.stdin) {
			return usagef("%s: no terminal to confirm on: add -yes to release without asking", op)
		}
		fmt.Fprintf(c.stderr, "%s.\nForce-release it? Its holder's context ends at its next renewal, "+
			"and the next holder gets a higher fence. [y/N] ", describe(info))
		answer, err := readLine(ctx, c.stdin)
		if err != nil {
			return fmt.Errorf("%s: no answer: %w", op, err)
		}
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return fmt.Errorf("%s: not released", op)
		}
	}
	if c.force && info.Holders > 1 {
		if err := c.forceRelease(ctx, op, name, 0); err != nil {
			return err
		}
		return c.released(info, fmt.Sprintf("released every holder of %s (-force; %d were shown, the newest %s)",
			text(name), info.Holders, holder(info)))
	}
	err = c.call(ctx, op, func(ctx context.Context) error { return c.store.ForceRelease(ctx, name, info.Fence) })
	if !c.force || !errors.Is(err, guard.ErrChangedHands) {
		if err = c.refused(ctx, op, err); err != nil {
			return err
		}
		return c.released(info, "released "+describe(info))
	}
	// -force: free the holder found instead, and say it was not the one shown.
	now, err := c.inspect(ctx, "release", name)
	switch {
	case err != nil:
		return err
	case !now.Held:
		return fmt.Errorf("%s: %w (it was freed after it was shown)", op, guard.ErrNotHeld)
	}
	if err := c.forceRelease(ctx, op, name, now.Fence); err != nil {
		return err
	}
	if err := c.released(now, "released "+describe(now)); err != nil {
		return err
	}
	return fmt.Errorf("%s: the lock shown (fence %d) changed hands before the release; -force released the holder found instead: %s",
		op, info.Fence, holder(now))
}

// forceRelease frees name if it is held with fence (any fence for 0), and turns the store's
// refusals into release's errors (see refused).
func (c *cli) forceRelease(ctx context.Context, op, name string, fence uint64) error {
	err := c.call(ctx, op, func(ctx context.Context) error { return c.store.ForceRelease(ctx, name, fence) })
	return c.refused(ctx, op, err)
}

// refused turns the error of a ForceRelease into release's: a name freed meanwhile, or one that
// changed hands, said as such.
func (c *cli) refused(ctx context.Context, op string, err error) error {
	var changed *guard.ChangedHandsError
	switch {
	case errors.As(err, &changed):
		return c.changedHands(ctx, op, changed)
	case errors.Is(err, guard.ErrNotHeld):
		return fmt.Errorf("%w (it was freed after it was shown)", err)
	}
	return err
}

// released prints the lock that release freed: its JSON object with -json, else line.
func (c *cli) released(info guard.LockInfo, line string) error {
	if c.json {
		return writeJSON(c.stdout, toJSON(info))
	}
	_, err := fmt.Fprintln(c.stdout, line)
	return err
}

// changedHands is release's error when the name changed hands after it was shown: it says the
// fence shown and the one found, and who holds the name now when a look at it still finds that
// fence.
func (c *cli) changedHands(ctx context.Context, op string, changed *guard.ChangedHandsError) error {
	now := fmt.Sprintf("fence %d holds it", changed.Found)
	if info, err := c.inspect(ctx, "release", changed.Name); err == nil && info.Held && info.Fence == changed.Found {
		now = holder(info)
	}
	return fmt.Errorf("%s: not released: it changed hands after it was shown with fence %d; now %s; "+
		"run release again to release the new holder", op, changed.Fence, now)
}

// readLine reads one line from r, or returns ctx's error when ctx ends first. The read then
// goes on in its goroutine until the process exits: a read from a terminal cannot be
// cancelled. Only the binary gets here (run's tests give no terminal), and it exits next.
func readLine(ctx context.Context, r io.Reader) (string, error) {
	type result struct {
		line string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		line, err := bufio.NewReader(r).ReadString('\n')
		if err == io.EOF && line != "" {
			err = nil
		}
		done <- result{line, err}
	}()
	select {
	case res := <-done:
		return res.line, res.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// watch lists the locks under prefix every -interval until ctx ends, and then returns nil.
// On a terminal each refresh redraws the screen; otherwise it appends the refreshes, each
// after a header line (with -json, one array per line). A first refresh that fails ends
// watch with its error; later failures are reported and the watch goes on.
func (c *cli) watch(ctx context.Context, prefix string) error {
	redraw := !c.json && isTerminal(c.stdout)
	ticker := time.NewTicker(c.interval)
	defer ticker.Stop()
	for first := true; ; first = false {
		locks, err := c.listAll(ctx, prefix)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && first:
			return err
		case err != nil:
			fmt.Fprintf(c.stderr, "guardctl: %s (still watching)\n", c.message(err))
		default:
			var frame bytes.Buffer
			if !c.json {
				if redraw {
					frame.WriteString("\x1b[H\x1b[2J") // cursor home, clear the screen
				}
				fmt.Fprintf(&frame, "Every %v: guardctl list %q on %s  %s\n\n",
					c.interval, prefix, c.backend.url, time.Now().In(c.loc).Format(time.RFC3339))
			}
			if err := c.printLocks(&frame, locks, prefix); err != nil {
				return err
			}
			if !c.json && !redraw {
				frame.WriteByte('\n')
			}
			if _, err := c.stdout.Write(frame.Bytes()); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// isTerminal reports whether f is an *os.File open on a terminal.
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	return ok && term.IsTerminal(int(file.Fd()))
}
