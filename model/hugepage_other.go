//go:build !linux

package model

// adviseHuge is a no-op where there are no transparent huge pages to ask
// for.
func adviseHuge([]byte) {}
