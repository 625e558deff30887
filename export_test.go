package guard

// HeldLocks returns how many locks g holds: for tests that check that ended locks are
// forgotten.
func HeldLocks(g *Guard) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held.Len()
}
