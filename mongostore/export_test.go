package mongostore

import "time"

// SetWallOffset moves the wall clock that s compares with its monotonic one by d, as a host
// suspended for d would see it.
func SetWallOffset(s *Store, d time.Duration) {
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	s.clock.wallOffset = func() time.Duration { return d }
}
