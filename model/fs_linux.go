package model

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// preallocate reserves size bytes for f, so a full disk fails the export
// at once instead of after minutes of writing, and the file is laid out in
// few extents.
func preallocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		// Not every file system supports fallocate; a sparse file will do.
		return f.Truncate(size)
	}
	return err
}

// exchange atomically swaps the directory entries a and b.
func exchange(a, b string) error {
	return unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
}

// dropCached asks the kernel to drop the clean, unmapped page-cache pages of
// f's bytes [off, off+n).
func dropCached(f *os.File, off, n int64) error {
	return unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED)
}
