package shm

import "syscall"

// FileIdentity identifies the file at path now: its inode. Each
// generation's segment is a new file renamed over the one path, so a
// process attached to one generation learns that a newer one took the path
// when the identity changes (frontends re-attach, the accelerator serves
// the newer generation beside the draining one).
func FileIdentity(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
