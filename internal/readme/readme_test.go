package readme_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-co-op/gocron/v2"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/gocronlock"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
	"github.com/guardlock/guard/tracing"
)

// What the quick start refers to.
type Withdrawal struct {
	AccountID string
	Amount    int64
}

type service struct{}

func (service) Withdraw(context.Context, Withdrawal) (string, error) { return "receipt", nil }

var (
	svc             service
	db              *sql.DB
	buildReport     = func(context.Context) error { return nil }
	withdrawHandler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
)

// quickStart is the README's quick start, between the markers, as it compiles.
func quickStart(ctx context.Context, id string) error {
	// quick start begins
	g := guard.New(memstore.New()) // or redisstore.New(redisClient), pgstore.New(pool), …
	defer g.Close(ctx)

	// A function locked per argument: one withdrawal per account at a time, across instances.
	withdraw := decorators.MustFunc(g, "account:{AccountID}", svc.Withdraw, guard.WaitTime(2*time.Second))
	receipt, err := withdraw(ctx, Withdrawal{AccountID: "42", Amount: 100})

	// A scheduled job that runs once per tick across instances (hold half the period).
	report := decorators.MustJob(g, "report:nightly", buildReport, guard.MinHold(12*time.Hour))
	if err := report(ctx); err != nil && !errors.Is(err, guard.ErrNotAcquired) {
		log.Print(err) // ErrNotAcquired: another instance had the tick
	}

	// The same with gocron v2: every run of every job is locked by its name.
	locker, _ := gocronlock.NewLocker(g)
	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker))

	// An HTTP route locked per URL parameter and header: 423 Locked when busy, 400 when missing.
	r := chi.NewRouter()
	r.With(middleware.Lock(g, "tenant:{header.X-Tenant}:account:{id}", guard.WaitTime(2*time.Second))).
		Post("/accounts/{id}/withdraw", withdrawHandler)

	// Inside the locked code: the context is cancelled if the lock is lost; pass the fence on.
	l, _ := guard.FromContext(ctx)
	db.ExecContext(ctx, "UPDATE accounts SET … , fence = $1 WHERE id = $2 AND fence < $1", l.Fence(), id)

	// Lock waits in your traces.
	g = guard.New(memstore.New(), guard.WithObserver(tracing.New()))
	// quick start ends
	_, _, _ = receipt, err, s
	return nil
}

// TestREADMEShowsTheQuickStart checks that README.md's quick start is quickStart's body, so that
// what readers copy compiles.
func TestREADMEShowsTheQuickStart(t *testing.T) {
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)// quick start begins\n(.*?)\t// quick start ends`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no quick start markers")
	}
	var want []string
	for _, line := range strings.Split(strings.TrimRight(string(m[1]), "\n"), "\n") {
		want = append(want, strings.TrimPrefix(line, "\t"))
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)## Quick start\n.*?```go\n(.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README.md has no Go block under \"## Quick start\"")
	}
	got := strings.Split(strings.TrimRight(string(block[1]), "\n"), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("README.md's quick start differs from quickStart in internal/readme/readme_test.go:\n--- README\n%s\n--- compiled\n%s",
			strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
