//go:build !guard_control

package lease

// control is false in every real build. Built with the guard_control tag, the Scheduler
// breaks one of its rules on purpose — an Extend neither waits for nor cancels the claim of
// a hand-over, as before issue 16 — so that the deterministic simulation (internal/sim) can
// show that it catches a broken engine. It hedges every renewal unanswered for a while, too,
// as the engine did then: restrained hedging (stuck) made a claim that lands after an Extend
// so rare that a million simulated acquisitions no longer found the broken rule.
const control = false
