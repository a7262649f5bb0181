//go:build race

package shmbackend

// raceEnabled: the race detector's runtime allocates when a goroutine
// parks, so allocation counts of calls that wait are not the build's.
const raceEnabled = true
