//go:build !linux

package hugepage

import (
	"errors"
	"fmt"
)

// Region is a mapped region; Map always fails on this platform, which has
// no huge page support in this package.
type Region struct{}

// Map is not supported on this platform.
func Map(size int, opts Options) (*Region, error) {
	return nil, fmt.Errorf("hugepage: map %d bytes: %w", size, errors.ErrUnsupported)
}

// Bytes returns nil.
func (r *Region) Bytes() []byte { return nil }

// Mode returns Mode4K.
func (r *Region) Mode() Mode { return Mode4K }

// FallbackReasons returns nil.
func (r *Region) FallbackReasons() []error { return nil }

// HugePageFraction is not supported on this platform.
func (r *Region) HugePageFraction() (float64, error) { return 0, errors.ErrUnsupported }

// PageSize is not supported on this platform.
func (r *Region) PageSize() (int, error) { return 0, errors.ErrUnsupported }

// Close does nothing.
func (r *Region) Close() error { return nil }
