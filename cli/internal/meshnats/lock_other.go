//go:build !unix

package meshnats

// lockStore does nothing where flock is not available: one server per
// store directory is then the operator's to ensure.
func lockStore(string) (func(), error) { return func() {}, nil }
