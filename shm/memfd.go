package shm

import (
	"errors"
	"fmt"
	"math/bits"

	"golang.org/x/sys/unix"
)

// A segment's memory is several memfds, so that each process can be
// handed exactly the memory its role may touch (see doc.go, Trust):
//
//	memfd      image regions                              owner  accelerator  frontend
//	header     header page                                rw     r            r
//	bell       bell page                                  rw     rw           rw
//	core       accelerator page, batch ring, staging meta rw     rw           -
//	staging    staging buffers                            rw     rw           -
//	lane i     lane i's control block and arena           rw     rw           rw (its own lanes)
//
// Every memfd is sealed against shrinking and growing (F_SEAL_SHRINK,
// F_SEAL_GROW) and against further seals, so no process can truncate one
// under another's mapping. The header is also sealed F_SEAL_FUTURE_WRITE
// once the owner has mapped it: its writable mapping is the only one there
// will ever be, and a process holding its descriptor (which the frontends
// and the accelerator get) cannot make another, not even by reopening it
// read-write through /proc/self/fd. The core and staging memfds are never
// handed to a frontend at all, and a lane memfd only to the frontend the
// lane is assigned to; a lane that changes hands gets a fresh memfd first
// (broker.swapLane), so a previous owner's mapping reaches nothing anyone
// still reads.

// memfd kinds, in the order the broker hands them out.
const (
	fdHeader = iota
	fdBell
	fdCore
	fdStaging
	numShared
)

// piece is one mapping of a memfd range into the image.
type piece struct {
	kind  int   // fdHeader.. or -1 for a lane
	fdOff int64 // offset in the memfd
	off   int   // offset in the image
	n     int
}

// sizes are the memfd sizes the layout implies.
type sizes struct {
	shared  [numShared]int
	lane    int
	staging int // bytes of staging data mapped (staging memfd size)
	vm      int // address space to reserve
}

// memfdSizes computes every memfd's size; block is the staging memfd's
// page size (PageSize, or the huge page size).
func (l layout) memfdSizes(g Geometry, block int) sizes {
	var z sizes
	z.shared[fdHeader] = HeaderBytes
	z.shared[fdBell] = PageSize
	z.shared[fdCore] = PageSize + (l.stagingData - l.batchRing)
	z.staging = roundUp(g.StagingCount*g.StagingBytes, block)
	z.shared[fdStaging] = z.staging
	z.lane = l.laneStride + g.ArenaBytes
	z.vm = l.stagingData + z.staging
	return z
}

// sharedPieces are the mappings of the header, bell, core and staging
// memfds.
func (l layout) sharedPieces(z sizes) []piece {
	return []piece{
		{kind: fdHeader, fdOff: 0, off: 0, n: HeaderBytes},
		{kind: fdBell, fdOff: 0, off: l.bell, n: PageSize},
		{kind: fdCore, fdOff: 0, off: l.accel, n: PageSize},
		{kind: fdCore, fdOff: PageSize, off: l.batchRing, n: l.stagingData - l.batchRing},
		{kind: fdStaging, fdOff: 0, off: l.stagingData, n: z.staging},
	}
}

// lanePieces are the two mappings of lane i's memfd: control block, arena.
func (l layout) lanePieces(i int, g Geometry) [2]piece {
	return [2]piece{
		{kind: -1, fdOff: 0, off: l.laneBase(i), n: l.laneStride},
		{kind: -1, fdOff: int64(l.laneStride), off: l.arenaBase(i, g), n: g.ArenaBytes},
	}
}

// Seals every memfd gets; the header also gets F_SEAL_FUTURE_WRITE.
const baseSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// newMemfd makes a sealable memfd of size bytes. block > PageSize asks for
// huge pages of that size (MFD_HUGETLB). With reserve, every page is
// allocated now (fallocate), so a shortage is an error here instead of a
// SIGBUS in the middle of serving.
func newMemfd(name string, size, block int, reserve bool) (int, error) {
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	if block > PageSize {
		flags |= unix.MFD_HUGETLB | bits.TrailingZeros(uint(block))<<unix.MFD_HUGE_SHIFT
	}
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return -1, fmt.Errorf("memfd_create %s: %w", name, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("size memfd %s to %d bytes: %w", name, size, err)
	}
	if reserve {
		if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
			unix.Close(fd)
			// A memfd's pages are charged to the memory cgroup, not to
			// /dev/shm: a shortage shows as ENOMEM (or ENOSPC for huge
			// pages). Callers test for ENOSPC, so both say it.
			if errors.Is(err, unix.ENOMEM) {
				err = fmt.Errorf("%w (%w)", unix.ENOSPC, err)
			}
			return -1, fmt.Errorf("reserve %d bytes of memfd %s: %w", size, name, err)
		}
	}
	return fd, nil
}

// seal adds seals to fd.
func seal(fd, seals int) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return fmt.Errorf("seal memfd: %w", err)
	}
	return nil
}

// checkMemfd verifies that fd, received from the broker, is a memfd of
// want bytes that nobody can shrink: mapping fewer bytes than that would
// fault later, and an unsealed one could be cut under the mapping.
func checkMemfd(fd, want int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat memfd: %w", err)
	}
	if st.Size != int64(want) {
		return fmt.Errorf("%w: memfd has %d bytes, the layout needs %d", ErrGeometry, st.Size, want)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("read memfd seals: %w", err)
	}
	if seals&baseSeals != baseSeals {
		return fmt.Errorf("%w: memfd not sealed against resizing (seals %#x)", ErrUnsafeFile, seals)
	}
	return nil
}

// setUndumpable makes this process non-dumpable, which keeps processes of
// the same user out of it: its /proc/<pid>/fd, /proc/<pid>/mem and
// /proc/<pid>/map_files become root's, and ptrace and process_vm_writev
// are refused without CAP_SYS_PTRACE. Otherwise a frontend could simply
// open the embedder's memfds through /proc and map them read-write. It
// leaves /proc/<pid>/stat readable (liveness checks) and /proc/self
// usable by the process itself (the Prometheus process collector).
func setUndumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}
