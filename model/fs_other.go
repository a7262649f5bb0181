//go:build !linux

package model

import (
	"errors"
	"os"
)

// preallocate sizes f; only Linux reserves the blocks up front.
func preallocate(f *os.File, size int64) error { return f.Truncate(size) }

// exchange is not available off Linux; publishDir falls back to two renames.
func exchange(a, b string) error { return errors.ErrUnsupported }

// dropCached is a no-op off Linux: the kernel reclaims the clean pages
// when it needs them.
func dropCached(f *os.File, off, n int64) error { return nil }
