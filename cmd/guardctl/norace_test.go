//go:build !race

package main

// raceEnabled reports that the tests run with -race: TestMain then builds the binary with it.
const raceEnabled = false
