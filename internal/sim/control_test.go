package sim

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// catch runs seeds of cfg until one breaks a guarantee whose report contains want, and fails
// when none has within budget acquisitions: the control shows that the checks catch the
// broken engine (or backend) they are given, and how soon.
func catch(t *testing.T, name, want string, budget int64, configure func(*Config)) {
	start := time.Now()
	var total int64
	for seed := uint64(1); total < budget; seed++ {
		var rep *Report
		synctest.Test(t, func(t *testing.T) {
			cfg := DefaultConfig(seed)
			cfg.Acquisitions = *perRunFlag
			configure(&cfg)
			rep = Run(cfg)
		})
		total += rep.Acquisitions
		for _, v := range rep.Violations {
			if strings.Contains(v, want) {
				t.Logf("control %q caught at seed %d, after %d acquisitions in %v: %s", name, seed, total,
					time.Since(start).Round(time.Millisecond), v)
				return
			}
		}
	}
	t.Errorf("control %q: %d acquisitions simulated, and no run found it broken", name, total)
}

// TestControlLongPlaces: a backend whose queue places outlive the lease their waiter asked for
// (as before issue 16) breaks bound (d); the simulation must catch it.
func TestControlLongPlaces(t *testing.T) {
	catch(t, "queue places outlive their TTL", "(d)", 200000, func(c *Config) {
		c.LongPlaces, c.QueueTimeout = true, time.Second
	})
}
