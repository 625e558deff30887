package sim

import (
	"flag"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var (
	seedFlag   = flag.Uint64("sim.seed", 0, "run only this seed")
	repeatFlag = flag.Int("sim.repeat", 1, "run the seed this many times")
	acqsFlag   = flag.Int("sim.acquisitions", 20000, "acquisitions to simulate in all, over as many seeds as it takes")
	perRunFlag = flag.Int("sim.per-run", 5000, "acquisitions per seed")
	verbose    = flag.Bool("sim.v", false, "log every run's report, not only failing ones")
	trailFlag  = flag.Bool("sim.trail", false, "print what the server did with a name beside a violation of bound (c)")
)

// TestSimulation runs the simulation over many seeds, in parallel, until it has simulated
// -sim.acquisitions grants, and fails with the seed of every run whose history broke a
// guarantee. -sim.seed replays one seed.
func TestSimulation(t *testing.T) {
	debug.SetGCPercent(400) // the runs allocate much and keep little
	if *seedFlag != 0 {
		for range *repeatFlag {
			runSeed(t, *seedFlag, *perRunFlag)
		}
		return
	}
	seeds := (*acqsFlag + *perRunFlag - 1) / *perRunFlag
	var total atomic.Int64
	start := time.Now()
	t.Run("seeds", func(t *testing.T) {
		for seed := uint64(1); seed <= uint64(seeds); seed++ {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				t.Parallel()
				total.Add(runSeed(t, seed, *perRunFlag))
			})
		}
	})
	t.Logf("%d acquisitions simulated over %d seeds in %v", total.Load(), seeds, time.Since(start).Round(time.Millisecond))
}

func runSeed(t *testing.T, seed uint64, acqs int) int64 {
	var rep *Report
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig(seed)
		cfg.Acquisitions = acqs
		cfg.Trail = *trailFlag
		cfg.Faults = seed%4 != 0 // every fourth run without faults: the bounds of calm times, all along
		rep = Run(cfg)
	})
	if rep == nil {
		return 0
	}
	if *verbose || rep.Failed() {
		t.Log(rep)
	}
	if rep.Failed() {
		t.Errorf("seed %d broke a guarantee; replay: go test ./internal/sim -run TestSimulation -sim.seed=%d -sim.per-run=%d", seed, seed, acqs)
	}
	return rep.Acquisitions
}
