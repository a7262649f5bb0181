//go:build !race

package shmbackend

const raceEnabled = false
