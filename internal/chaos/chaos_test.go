package chaos_test

import (
	crand "crypto/rand"
	"encoding/binary"
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/guardlock/guard/internal/chaos"
)

var (
	seedFlag      = flag.Uint64("chaos.seed", 0, "seed of the chaos run (0: random, or $"+seedEnv+"); printed by every run to replay it")
	durationFlag  = flag.Duration("chaos.duration", 30*time.Second, "how long faults are injected into each backend, at least")
	minAcqsFlag   = flag.Int("chaos.acquisitions", 5000, "the run goes on (up to five times -chaos.duration) until it has seen this many grants")
	minFaultsFlag = flag.Int("chaos.faults", 20, "…and injected this many faults")
	workersFlag   = flag.Int("chaos.workers", 4, "worker processes per backend (at least 4)")
	loopsFlag     = flag.Int("chaos.loops", 4, "goroutines contending in each worker process")
)

// seedEnv gives the seed when -chaos.seed does not (for go test ./... runs).
const seedEnv = "GUARD_CHAOS_SEED"

// backends are the deployments the chaos run covers, one line each. memstore is not here: it
// lives in one process, and the run needs several.
var backends = []struct {
	name  string
	start func(t *testing.T) *chaos.Target
}{
	{"redis", chaos.StartRedis},
	{"redis-cluster", chaos.StartRedisCluster},
	{"mongodb", chaos.StartMongo},
	{"postgres", chaos.StartPostgres},
	{"mariadb", chaos.StartMariaDB},
}

// TestChaos runs workers in separate processes against each backend while faults are
// injected at random, and checks the recorded history: validity windows never overlap, the
// lock history is linearizable, the fenced resource accepted writes in fence order only, and
// no holder's context outlived its lease. Replay a failing run with the seed it prints:
//
//	go test -race -run 'TestChaos$/redis$' ./internal/chaos -chaos.seed=N
func TestChaos(t *testing.T) {
	seed := chaosSeed(t)
	t.Logf("chaos seed %d (replay: -chaos.seed=%d)", seed, seed)
	var summaries []string
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			target := b.start(t)
			r := chaos.Run(t, target, chaos.Options{
				Seed: seed, Duration: *durationFlag, Workers: *workersFlag, Loops: *loopsFlag,
				MinAcquisitions: *minAcqsFlag, MinFaults: *minFaultsFlag, MaxDuration: 5 * *durationFlag,
			})
			summaries = append(summaries, r.Summary())
			t.Log(r.Summary())
			t.Log(r.Details())
			if r.Failed() {
				t.Errorf("chaos run on %s failed (seed %d; replay with -chaos.seed=%d):\n%s",
					b.name, seed, seed, failures(r))
			}
		})
	}
	for _, s := range summaries {
		t.Log(s)
	}
}

// TestChaosCatchesABrokenLock runs the same harness on a backend broken on purpose — it takes
// a held name anyway — with no fault injected: the checks must find overlapping holders and a
// history that is not linearizable. A chaos run that could not fail would prove nothing.
func TestChaosCatchesABrokenLock(t *testing.T) {
	seed := chaosSeed(t)
	target := chaos.StartRedis(t)
	target.Conn.Sabotage = "steal"
	r := chaos.Run(t, target, chaos.Options{
		Seed: seed, Duration: 4 * time.Second, NoFaults: true,
	})
	t.Log(r.Summary())
	assert.True(t, r.Failed(), "a lock that steals held names passed the checks")
	assert.Positive(t, r.Overlaps)
	assert.Positive(t, r.Outlived)
	assert.True(t, strings.HasPrefix(r.Linearizable, "illegal"), "linearizable: %s", r.Linearizable)
	assert.Zero(t, r.StaleAccepted, "the resource's fence check still holds")
	assert.Empty(t, r.Problems, "the harness itself must work")
}

// TestChaosCatchesABrokenSemaphore runs the harness with workers that take permits of a
// semaphore of three while the check expects two, with no fault injected: the permit check
// must find three permits live at once.
func TestChaosCatchesABrokenSemaphore(t *testing.T) {
	seed := chaosSeed(t)
	target := chaos.StartRedis(t)
	target.Conn.Sabotage = "permits"
	r := chaos.Run(t, target, chaos.Options{
		Seed: seed, Duration: 4 * time.Second, NoFaults: true,
	})
	t.Log(r.Summary())
	assert.True(t, r.Failed(), "three permits of a semaphore of two passed the checks")
	assert.Positive(t, r.PermitExcess)
	assert.Equal(t, 3, r.MaxPermitHolders)
	assert.Zero(t, r.Overlaps, "the mutex is not broken")
	assert.Zero(t, r.RWOverlaps, "nor the read-write lock")
	assert.Empty(t, r.Problems, "the harness itself must work")
}

// chaosSeed returns the seed from -chaos.seed, $GUARD_CHAOS_SEED, or a random one.
func chaosSeed(t *testing.T) uint64 {
	if *seedFlag != 0 {
		return *seedFlag
	}
	if s := os.Getenv(seedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("$%s=%q: %v", seedEnv, s, err)
		}
		return n
	}
	var b [8]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])>>1 | 1
}

// failures lists the report's violations and problems, the first few in full.
func failures(r *chaos.Report) string {
	const show = 5
	var b strings.Builder
	list := func(title string, items []string) {
		if len(items) == 0 {
			return
		}
		b.WriteString(title + ":\n")
		for i, s := range items {
			if i == show {
				b.WriteString("  … and " + strconv.Itoa(len(items)-show) + " more\n")
				break
			}
			b.WriteString("  - " + s + "\n")
		}
	}
	list("guarantees broken", r.Violations)
	list("harness problems", r.Problems)
	return b.String()
}
