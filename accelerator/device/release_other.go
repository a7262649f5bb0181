//go:build !linux

package device

// ReleaseCode does nothing where the kernel has no MADV_PAGEOUT.
func (r *Runtime) ReleaseCode() (int64, error) { return 0, nil }
