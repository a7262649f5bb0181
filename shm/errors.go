package shm

import (
	"errors"
	"fmt"
)

// Sentinel errors. Functions wrap them with context ("shm: attach /dev/shm/x:
// ..."); match with errors.Is.
var (
	// ErrBadMagic: the file is not a recmesh segment.
	ErrBadMagic = errors.New("shm: not a recmesh segment (bad magic)")
	// ErrVersion: the segment was written with another layout version.
	ErrVersion = errors.New("shm: layout version mismatch")
	// ErrGeneration: the segment's generation is not the one asked for, or a
	// new generation would not be newer than the one it replaces.
	ErrGeneration = errors.New("shm: generation mismatch")
	// ErrModel: the segment serves another model id.
	ErrModel = errors.New("shm: model id mismatch")
	// ErrGeometry: the geometry is out of range or inconsistent with the file.
	ErrGeometry = errors.New("shm: bad geometry")
	// ErrNotReady: the segment is still being created or its state word is unknown.
	ErrNotReady = errors.New("shm: segment not ready")
	// ErrDraining: a newer generation replaced this segment; finish in-flight
	// work and attach to the new one.
	ErrDraining = errors.New("shm: segment draining")
	// ErrClosed: the owner shut the segment down cleanly.
	ErrClosed = errors.New("shm: segment closed")
	// ErrOwnerDead: the owner (embedder) process is gone or stopped beating.
	ErrOwnerDead = errors.New("shm: segment owner dead")
	// ErrAcceleratorDead: the accelerator process is gone or stopped beating.
	ErrAcceleratorDead = errors.New("shm: accelerator dead")
	// ErrNoAccelerator: no accelerator has attached to the segment yet.
	ErrNoAccelerator = errors.New("shm: no accelerator attached")
	// ErrAcceleratorPresent: another live accelerator holds the segment.
	ErrAcceleratorPresent = errors.New("shm: another accelerator is attached")
	// ErrNoFreeLane: every lane is owned.
	ErrNoFreeLane = errors.New("shm: no free lane")
	// ErrLaneLost: the lane was reclaimed or released; the handle is dead.
	ErrLaneLost = errors.New("shm: lane lost")
	// ErrLaneInactive: the lane is not active (free, releasing or draining).
	ErrLaneInactive = errors.New("shm: lane not active")
	// ErrStaleEpoch: an entry names an older epoch of its lane; the request
	// belonged to a previous owner and is dropped.
	ErrStaleEpoch = errors.New("shm: stale lane epoch")
	// ErrFull: the ring or the staging pool has no room.
	ErrFull = errors.New("shm: full")
	// ErrCorrupt: a value read from shared memory failed validation.
	ErrCorrupt = errors.New("shm: corrupt shared memory")
	// ErrNotOwner: the call is reserved for the process that created the segment.
	ErrNotOwner = errors.New("shm: not the segment owner")
	// ErrState: a staging buffer or slot is not in the state the call needs.
	ErrState = errors.New("shm: wrong state")
	// ErrUnsafeFile: the socket at the segment path, or the broker behind
	// it, is not one this process may trust: a symbolic link, not a socket,
	// owned by another user, writable by every user, or memory it hands
	// out is not sealed.
	ErrUnsafeFile = errors.New("shm: unsafe segment file")
	// ErrSegmentLost: an access to the mapping faulted: a region this
	// process was not given, or memory gone under it. The generation is
	// unusable to this process; re-attach or, as owner, create the next one.
	ErrSegmentLost = errors.New("shm: segment lost (an access to its mapping faulted)")
	// ErrProtocol: the segment's broker socket sent or received a message
	// that does not follow the attach protocol.
	ErrProtocol = errors.New("shm: broker protocol error")
)

// errorf wraps a sentinel with a formatted detail.
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}
