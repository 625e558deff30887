//go:build guard_control

package lease

// control breaks the Scheduler on purpose: see control.go.
const control = true
