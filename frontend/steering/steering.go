// Package steering owns how new connections are spread over the frontends
// that share one port through SO_REUSEPORT. In eBPF mode an SK_REUSEPORT
// program, attached to the port's reuseport group, sends each new
// connection to the least loaded frontend that is ready, never to one that
// is starting or draining, and (kernel ≥ 5.14) moves connections still
// queued on a closing listener to a live one instead of resetting them.
// Frontends share the program's maps through a pin directory in bpffs, so
// separate processes (and containers that mount the same bpffs) steer
// together.
//
// The maps:
//
//   - socks, a REUSEPORT_SOCKARRAY: slot → listening socket;
//   - state, an mmap-able ARRAY: slot → {ready, in-flight calls,
//     connections, reserved}, u32 each, written by the slot's frontend
//     with plain atomic stores into the mapping (no system call per call);
//   - owners, a HASH: slot → owner, whose BPF_NOEXIST insert is the one
//     atomic claim of a slot among processes.
//
// A slot whose listener is gone (its frontend died) is cleared by the next
// frontend's Sweep; until then the kernel's own hash covers connections
// the program could not place, so the group never routes to nobody.
package steering

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// Mode is how a frontend's connections are steered.
type Mode string

const (
	// ModeEBPF: the SK_REUSEPORT program picks the socket.
	ModeEBPF Mode = "ebpf"
	// ModeKernelHash: the kernel's 4-tuple hash picks; a frontend keeps
	// out of the group until it is ready instead.
	ModeKernelHash Mode = "kernel-hash"
)

// MaxFrontends is how many frontends one group steers among: the
// segment's lane count, since each frontend holds a lane.
const MaxFrontends = 16

// DefaultPinRoot is where groups pin their maps, one directory per port.
const DefaultPinRoot = "/sys/fs/bpf/recmesh"

// slotBytes is one state entry: ready, in-flight, connections, and
// connections the program sent that the frontend has not accepted yet
// (without them a burst of new connections would all see the same counts
// and herd onto one frontend).
const (
	slotBytes    = 16
	offReady     = 0
	offInflight  = 4
	offConns     = 8
	offPending   = 12
	staleClaimAt = 10 * time.Second
)

// Group is a frontend's handle on the shared maps of one port's group.
type Group struct {
	dir     string
	socks   *ebpf.Map
	state   *ebpf.Map
	owners  *ebpf.Map
	prog    *ebpf.Program
	migrate bool
	mem     []byte // the state map, mapped
}

// owner is the value of an owners entry.
type owner struct {
	PID     uint32
	_       uint32
	Claimed int64 // unix ns
}

// Open loads the steering program and opens (or, for the first frontend
// of the port, creates and pins) the group's maps under dir. It fails when
// this process may not use eBPF here (no CAP_BPF, no bpffs, an old
// kernel): the caller then falls back to ModeKernelHash.
//
// CAP_BPF is the only capability it needs: the kernel treats an
// SK_REUSEPORT program like a socket filter, not as one of the program
// types that also need CAP_NET_ADMIN, and attaching it to the frontend's
// own socket (SO_ATTACH_REUSEPORT_EBPF) needs none.
func Open(dir string) (*Group, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrPermission) {
			// systemd mounts /sys/fs/bpf root-only (0700): a frontend
			// running as another user can neither create its group's
			// directory there nor reach one made for it.
			return nil, fmt.Errorf("steering: pin dir: %w (this user needs a directory of its own on the bpffs, and a path to it: "+
				"install -d -o %d -m 0700 <dir>, bound elsewhere where the bpffs root is root-only, as deploy/compose.ebpf.yaml does)", err, os.Geteuid())
		}
		return nil, fmt.Errorf("steering: pin dir: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		return nil, fmt.Errorf("steering: %s is not on a bpffs mount (mount -t bpf bpf /sys/fs/bpf)", dir)
	}
	g := &Group{dir: dir}
	var err error
	if g.socks, err = openMap(dir, "socks", &ebpf.MapSpec{Type: ebpf.ReusePortSockArray, KeySize: 4, ValueSize: 8, MaxEntries: MaxFrontends}); err != nil {
		return nil, err
	}
	if g.state, err = openMap(dir, "state", &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: slotBytes, MaxEntries: MaxFrontends, Flags: unix.BPF_F_MMAPABLE}); err != nil {
		g.Close()
		return nil, err
	}
	if g.owners, err = openMap(dir, "owners", &ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 16, MaxEntries: MaxFrontends}); err != nil {
		g.Close()
		return nil, err
	}
	if g.mem, err = unix.Mmap(g.state.FD(), 0, pageRound(MaxFrontends*slotBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		g.Close()
		return nil, fmt.Errorf("steering: map state: %w", err)
	}
	if g.prog, g.migrate, err = loadProgram(g.socks, g.state); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// Migrates reports whether the program moves connections queued on a
// closing listener (BPF_SK_REUSEPORT_SELECT_OR_MIGRATE).
func (g *Group) Migrates() bool { return g.migrate }

// capabilityError is the bpf system call refused: for want of CAP_BPF, or
// by a seccomp profile (Docker's admits bpf(2) to CAP_BPF only from Engine
// 23.0). Its message names what to grant instead of cilium/ebpf's hint to
// raise RLIMIT_MEMLOCK, which has not applied since Linux 5.11 charged BPF
// memory to the cgroup.
type capabilityError struct{ err error }

func (e *capabilityError) Error() string {
	return "operation not permitted: this process needs CAP_BPF (or root), and a seccomp profile that admits bpf(2)"
}

func (e *capabilityError) Unwrap() error { return e.err }

// explainPermission turns a permission error of the bpf system call into a
// capabilityError and returns any other error as it is.
func explainPermission(err error) error {
	if errors.Is(err, unix.EPERM) {
		return &capabilityError{err: err}
	}
	return err
}

func pageRound(n int) int {
	p := os.Getpagesize()
	return (n + p - 1) / p * p
}

// openMap opens the map pinned at dir/name, or creates and pins it. Two
// frontends creating it at once both succeed: the loser of the pin opens
// the winner's.
func openMap(dir, name string, spec *ebpf.MapSpec) (*ebpf.Map, error) {
	path := filepath.Join(dir, name)
	for range 3 {
		if m, err := ebpf.LoadPinnedMap(path, nil); err == nil {
			info, ierr := m.Info()
			if ierr != nil || info.Type != spec.Type || info.ValueSize != spec.ValueSize || info.MaxEntries != spec.MaxEntries {
				m.Close()
				return nil, fmt.Errorf("steering: %s is pinned with another layout; remove it (all frontends of the port stopped)", path)
			}
			return m, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("steering: open %s: %w", path, explainPermission(err))
		}
		spec := spec.Copy()
		spec.Name = "recmesh_" + name
		m, err := ebpf.NewMap(spec)
		if err != nil {
			return nil, fmt.Errorf("steering: create map %s: %w", name, explainPermission(err))
		}
		if err := m.Pin(path); err == nil {
			return m, nil
		} else if !errors.Is(err, os.ErrExist) {
			m.Close()
			return nil, fmt.Errorf("steering: pin %s: %w", path, err)
		}
		m.Close() // another frontend pinned it first: open theirs
	}
	return nil, fmt.Errorf("steering: could not open or pin %s", path)
}

// Close releases this process's handles; the pinned maps stay for the
// group's other frontends.
func (g *Group) Close() {
	if g.mem != nil {
		_ = unix.Munmap(g.mem)
		g.mem = nil
	}
	if g.prog != nil {
		g.prog.Close()
	}
	for _, m := range []*ebpf.Map{g.socks, g.state, g.owners} {
		if m != nil {
			m.Close()
		}
	}
}

func (g *Group) word(slot, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&g.mem[slot*slotBytes+off]))
}

// Member is one frontend's slot in the group.
type Member struct {
	g    *Group
	slot int
}

// Join claims a slot for the listening socket fd (already listening with
// SO_REUSEPORT), puts it in the socket array and attaches the program to
// the socket's reuseport group. The slot starts not ready.
func (g *Group) Join(fd int) (*Member, error) {
	slot, err := g.claim()
	if err != nil {
		return nil, err
	}
	m := &Member{g: g, slot: slot}
	atomic.StoreUint32(g.word(slot, offReady), 0)
	atomic.StoreUint32(g.word(slot, offInflight), 0)
	atomic.StoreUint32(g.word(slot, offConns), 0)
	atomic.StoreUint32(g.word(slot, offPending), 0)
	key := uint32(slot)
	if err := g.socks.Update(&key, uint64(fd), ebpf.UpdateAny); err != nil {
		m.release()
		return nil, fmt.Errorf("steering: put the listener in slot %d: %w", slot, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, g.prog.FD()); err != nil {
		m.release()
		return nil, fmt.Errorf("steering: attach the program: %w", err)
	}
	return m, nil
}

// claim takes the first free slot: one with no owner, or whose owner's
// listener has been gone for a while (a frontend that died).
func (g *Group) claim() (int, error) {
	me := owner{PID: uint32(os.Getpid()), Claimed: time.Now().UnixNano()}
	for slot := range MaxFrontends {
		key := uint32(slot)
		err := g.owners.Update(&key, &me, ebpf.UpdateNoExist)
		if err == nil {
			return slot, nil
		}
		if !errors.Is(err, ebpf.ErrKeyExist) {
			return 0, fmt.Errorf("steering: claim slot %d: %w", slot, err)
		}
		if g.stale(slot) {
			_ = g.owners.Delete(&key)
			if g.owners.Update(&key, &me, ebpf.UpdateNoExist) == nil {
				return slot, nil
			}
		}
	}
	return 0, fmt.Errorf("steering: all %d slots of %s are taken", MaxFrontends, g.dir)
}

// stale reports whether slot's owner claimed it long ago and has no
// listener in the socket array: it died (the kernel drops a closed socket
// from the array by itself).
func (g *Group) stale(slot int) bool {
	key := uint32(slot)
	var o owner
	if err := g.owners.Lookup(&key, &o); err != nil {
		return errors.Is(err, ebpf.ErrKeyNotExist)
	}
	if time.Since(time.Unix(0, o.Claimed)) < staleClaimAt {
		return false
	}
	var cookie uint64
	return errors.Is(g.socks.Lookup(&key, &cookie), ebpf.ErrKeyNotExist)
}

// Sweep marks not ready every slot whose listener is gone, so the program
// stops choosing a frontend that died without leaving. Frontends call it
// periodically.
func (g *Group) Sweep() {
	for slot := range MaxFrontends {
		if atomic.LoadUint32(g.word(slot, offReady)) == 0 {
			continue
		}
		key := uint32(slot)
		var cookie uint64
		if errors.Is(g.socks.Lookup(&key, &cookie), ebpf.ErrKeyNotExist) {
			atomic.StoreUint32(g.word(slot, offReady), 0)
		}
	}
}

// Slot is the member's index in the group.
func (m *Member) Slot() int { return m.slot }

// SetReady makes the program consider (or stop considering) this
// frontend for new connections.
func (m *Member) SetReady(ready bool) {
	v := uint32(0)
	if ready {
		v = 1
	}
	atomic.StoreUint32(m.g.word(m.slot, offReady), v)
}

// AddInflight and AddConns move the load the program compares.
func (m *Member) AddInflight(d int32) { atomic.AddUint32(m.g.word(m.slot, offInflight), uint32(d)) }
func (m *Member) AddConns(d int32)    { atomic.AddUint32(m.g.word(m.slot, offConns), uint32(d)) }

// Accepted records one accepted connection: one more connection, one
// fewer the program sent and the frontend had not yet taken.
func (m *Member) Accepted() {
	m.AddConns(1)
	p := m.g.word(m.slot, offPending)
	for {
		v := atomic.LoadUint32(p)
		if v == 0 || atomic.CompareAndSwapUint32(p, v, v-1) {
			return
		}
	}
}

// Pending is how many connections the program sent this member that it
// has not accepted yet (as far as the count knows: see ForgetPending).
func (m *Member) Pending() uint32 { return atomic.LoadUint32(m.g.word(m.slot, offPending)) }

// ForgetPending clears the count of connections sent but not accepted.
// The program counts each one it sends; one that never arrives (reset
// during the handshake) would count forever, so frontends clear it from
// time to time, far longer than an accept takes.
func (m *Member) ForgetPending() { atomic.StoreUint32(m.g.word(m.slot, offPending), 0) }

// Leave marks the slot not ready and gives it up. Call it after the
// listener closed (its queued connections migrate while the slot is not
// ready) or when the frontend stops.
func (m *Member) Leave() {
	m.SetReady(false)
	m.release()
}

func (m *Member) release() {
	key := uint32(m.slot)
	_ = m.g.socks.Delete(&key)
	_ = m.g.owners.Delete(&key)
}

// Load describes one slot, for tests and status.
type Load struct {
	Slot                           int
	Ready                          bool
	Inflight, Connections, Pending uint32
}

// Loads reads every claimed slot's state.
func (g *Group) Loads() []Load {
	var out []Load
	for slot := range MaxFrontends {
		key := uint32(slot)
		var o owner
		if g.owners.Lookup(&key, &o) != nil {
			continue
		}
		out = append(out, Load{Slot: slot, Ready: atomic.LoadUint32(g.word(slot, offReady)) != 0,
			Inflight: atomic.LoadUint32(g.word(slot, offInflight)), Connections: atomic.LoadUint32(g.word(slot, offConns)),
			Pending: atomic.LoadUint32(g.word(slot, offPending))})
	}
	return out
}

// sk_reuseport_md offsets (include/uapi/linux/bpf.h).
const (
	mdHash = 32
)

// SK_PASS lets the connection through (to the selected socket, or to the
// kernel's hash choice when none was selected).
const skPass = 1

// program is the steering program: among the MaxFrontends slots, visited
// from the connection hash onwards so ties spread, pick the ready one with
// the fewest in-flight calls, connections and connections sent but not yet
// accepted, select its socket and count the connection as sent. With no
// ready slot, or when the select fails (a socket just closed), it lets the
// kernel's hash choose.
func program(socks, state *ebpf.Map) asm.Instructions {
	const (
		ctx   = asm.R6
		best  = asm.R7 // slot index, -1 for none
		least = asm.R8 // its load
		value = asm.R9 // its state entry
		// Stack: the connection hash at fp-8, the map key at fp-4.
		hashAt = -8
		keyAt  = -4
	)
	insns := asm.Instructions{
		asm.Mov.Reg(ctx, asm.R1),
		asm.LoadMem(asm.R1, ctx, mdHash, asm.Word),
		asm.StoreMem(asm.RFP, hashAt, asm.R1, asm.Word),
		asm.Mov.Imm(best, -1),
		asm.Mov.Imm32(least, -1), // 0xffffffff, zero-extended
		asm.Mov.Imm(value, 0),
	}
	for k := range MaxFrontends {
		next := fmt.Sprintf("next%d", k)
		insns = append(insns,
			// key = (hash + k) mod MaxFrontends
			asm.LoadMem(asm.R1, asm.RFP, hashAt, asm.Word),
			asm.Add.Imm(asm.R1, int32(k)),
			asm.And.Imm(asm.R1, MaxFrontends-1),
			asm.StoreMem(asm.RFP, keyAt, asm.R1, asm.Word),
			asm.LoadMapPtr(asm.R1, state.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, keyAt),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, next),
			asm.LoadMem(asm.R1, asm.R0, offReady, asm.Word),
			asm.JEq.Imm(asm.R1, 0, next),
			asm.LoadMem(asm.R1, asm.R0, offInflight, asm.Word),
			asm.LoadMem(asm.R2, asm.R0, offConns, asm.Word),
			asm.Add.Reg(asm.R1, asm.R2),
			asm.LoadMem(asm.R2, asm.R0, offPending, asm.Word),
			asm.Add.Reg(asm.R1, asm.R2),
			asm.JGE.Reg(asm.R1, least, next),
			asm.Mov.Reg(least, asm.R1),
			asm.LoadMem(best, asm.RFP, keyAt, asm.Word),
			asm.Mov.Reg(value, asm.R0),
			asm.Mov.Imm(asm.R0, 0).WithSymbol(next), // a landing pad
		)
	}
	insns = append(insns,
		asm.JEq.Imm(best, -1, "pass"),
		asm.StoreMem(asm.RFP, keyAt, best, asm.Word),
		asm.Mov.Reg(asm.R1, ctx),
		asm.LoadMapPtr(asm.R2, socks.FD()),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, keyAt),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkSelectReuseport.Call(),
		asm.JNE.Imm(asm.R0, 0, "pass"),
		asm.JEq.Imm(value, 0, "pass"),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(value, asm.R1, asm.Word, offPending),
		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
	)
	return insns
}

// loadProgram loads the program for SELECT_OR_MIGRATE, or for SELECT on a
// kernel older than 5.14.
func loadProgram(socks, state *ebpf.Map) (*ebpf.Program, bool, error) {
	spec := &ebpf.ProgramSpec{
		Name:         "recmesh_steer",
		Type:         ebpf.SkReuseport,
		AttachType:   ebpf.AttachSkReuseportSelectOrMigrate,
		Instructions: program(socks, state),
		License:      "Apache-2.0",
	}
	p, err := ebpf.NewProgram(spec)
	if err == nil {
		return p, true, nil
	}
	spec.AttachType = ebpf.AttachSkReuseportSelect
	p, err2 := ebpf.NewProgram(spec)
	if err2 != nil {
		return nil, false, fmt.Errorf("steering: load program: %w (with migration: %v)", explainPermission(err2), err)
	}
	return p, false, nil
}
