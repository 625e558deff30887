//go:build !race

package e2e

// raceEnabled reports that the tests run with -race: the example binaries are built with it.
const raceEnabled = false
