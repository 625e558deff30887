//go:build guard_control

package sim

import (
	"testing"
	"time"
)

// TestControlClaimIgnoresExtend runs the engine built with the guard_control tag, whose lease
// scheduler lets a hand-over's claim go out after an Extend and undo it (issue 16, case 1):
// the simulation must find a holder trusting its lock past its lease on the server.
//
//	go test -tags guard_control -run TestControl ./internal/sim
func TestControlClaimIgnoresExtend(t *testing.T) {
	catch(t, "a claim that ignores a later Extend", "(a)", 1000000, func(c *Config) {
		c.QueueTimeout = 100 * time.Millisecond // leases longer than a place: handed over short, claimed later
		c.ExtendChance = 1                      // every fixed lease extended: more chances for the broken rule
	})
}
