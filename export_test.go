package guard

// HeldLocks returns how many locks g holds: for tests that check that ended locks are
// forgotten.
func HeldLocks(g *Guard) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held.Len()
}

// StallScheduler keeps g's lease scheduler from ending any lease until resume is called: for
// tests of a timer that fires late.
func StallScheduler(g *Guard) (resume func()) { return g.sched.Stall() }
