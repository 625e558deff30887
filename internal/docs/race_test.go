//go:build race

package docs

// raceEnabled reports that the tests run with -race: what they build and test is built with
// it too, which reuses the packages the race build of the repository compiled.
const raceEnabled = true
