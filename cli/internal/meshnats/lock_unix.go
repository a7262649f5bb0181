//go:build unix

package meshnats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockStore takes an exclusive lock on dir's lock file until the returned
// function is called: nats-server does not lock its store directory, and
// two servers writing one stream's files would corrupt it (two recmesh
// runs on one model root). The kernel drops the lock with the process, so
// a killed run leaves nothing to clean up.
func lockStore(dir string) (func(), error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("meshnats: JetStream store lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("meshnats: JetStream store %s: %w (another recmesh run on this model root? give it its own --jetstream-dir)", dir, ErrStoreInUse)
		}
		return nil, fmt.Errorf("meshnats: JetStream store lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}
