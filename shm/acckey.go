package shm

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// acceleratorKeyBytes is the accelerator key's length before hex encoding.
const acceleratorKeyBytes = 32

// AcceleratorKeyFile returns the accelerator key kept in the file at path
// (Options.AcceleratorKey, AttachOptions.AcceleratorKey). With create, a
// missing file is made first, readable by this user alone, holding a new
// random key: the embedder creates it, the accelerator only reads it. The
// file must be the caller's and closed to group and others, so a key
// other users could read is refused rather than trusted.
func AcceleratorKeyFile(path string, create bool) ([]byte, error) {
	if create {
		buf := make([]byte, acceleratorKeyBytes)
		if _, err := rand.Read(buf); err != nil {
			return nil, fmt.Errorf("shm: accelerator key: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		switch {
		case err == nil:
			_, werr := f.WriteString(hex.EncodeToString(buf) + "\n")
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				os.Remove(path)
				return nil, fmt.Errorf("shm: write accelerator key %s: %w", path, werr)
			}
		case !errors.Is(err, fs.ErrExist):
			return nil, fmt.Errorf("shm: create accelerator key %s: %w", path, err)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("shm: accelerator key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("shm: accelerator key %s: mode %v lets other users read it: chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("shm: accelerator key: %w", err)
	}
	key := bytes.TrimSpace(b)
	if len(key) < 2*16 {
		return nil, fmt.Errorf("shm: accelerator key %s: %d characters, want at least 32", path, len(key))
	}
	return key, nil
}
