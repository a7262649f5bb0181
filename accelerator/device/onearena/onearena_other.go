//go:build !linux

package onearena

// Set reports false: the limit is glibc's, and this is not Linux.
func Set() bool { return false }
