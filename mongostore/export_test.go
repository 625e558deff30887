package mongostore

import "time"

// SetWallOffset moves the wall clock that s compares with its monotonic one by d, as a host
// suspended for d would see it.
func SetWallOffset(s *Store, d time.Duration) {
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	s.clock.wallOffset = func() time.Duration { return d }
}

// SkewClock moves s's estimate of the server's clock by off and sets its uncertainty to unc,
// as a measurement that erred by off (|off| ≤ unc) would.
func SkewClock(s *Store, off, unc time.Duration) {
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	s.clock.base = s.clock.base.Add(off)
	s.clock.unc = unc
}
