package shm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The broker protocol: SOCK_SEQPACKET messages (one JSON object each, so
// no framing) over the unix socket at the segment path, descriptors riding
// along as SCM_RIGHTS. The client speaks first; the broker answers every
// request with one message, and pushes lane replacements to the
// accelerator, which acknowledges each.
//
//	client → broker                  broker → client (descriptors)
//	hello  {pid, pidns}              {gen, block}  (header, bell)
//	claim  {pid, pidns}              {lane, epoch} (lane memfd)
//	accel  {pid}                     {}            (core, staging), then one
//	                                 lane message per lane (lane memfd)
//	drain  {}                        {}            only from the owner's own pid
//	ack    {lane, seq}               —             after a pushed lane
//	                                 lane {lane, seq} (lane memfd), pushed
//
// A refusal is {code, err}: code names the sentinel (codeErrors).
type wireMsg struct {
	Op    string `json:"op,omitempty"`
	Pid   uint32 `json:"pid,omitempty"`
	PidNS uint64 `json:"pidns,omitempty"`
	Lane  int    `json:"lane"`
	Epoch uint32 `json:"epoch,omitempty"`
	Seq   uint64 `json:"seq,omitempty"`
	Gen   uint64 `json:"gen,omitempty"`
	Block int    `json:"block,omitempty"`
	Code  string `json:"code,omitempty"`
	Err   string `json:"err,omitempty"`
	// Key is the accelerator key an "accel" request presents.
	Key string `json:"key,omitempty"`
}

// codeErrors maps refusal codes to the sentinels a caller matches.
var codeErrors = map[string]error{
	"draining":  ErrDraining,
	"closed":    ErrClosed,
	"notready":  ErrNotReady,
	"nofree":    ErrNoFreeLane,
	"present":   ErrAcceleratorPresent,
	"notowner":  ErrNotOwner,
	"corrupt":   ErrCorrupt,
	"protocol":  ErrProtocol,
	"lanesetup": ErrNoFreeLane,
}

// errCode is the refusal code for err.
func errCode(err error) string {
	for c, s := range codeErrors {
		if errors.Is(err, s) {
			return c
		}
	}
	return "protocol"
}

// refusal turns a refusal message back into an error wrapping its sentinel.
func (m wireMsg) refusal() error {
	if m.Code == "" {
		return nil
	}
	s, ok := codeErrors[m.Code]
	if !ok {
		s = ErrProtocol
	}
	return fmt.Errorf("%w: broker: %s", s, m.Err)
}

func refuse(err error) wireMsg { return wireMsg{Code: errCode(err), Err: err.Error()} }

// maxWireFDs bounds the descriptors one message may carry.
const maxWireFDs = 8

// wireConn is one end of a broker connection. The socket is non-blocking
// and owned by an os.File, so reads wait in the runtime poller, honour
// deadlines, and end when the file is closed from another goroutine.
type wireConn struct {
	f  *os.File
	rc syscall.RawConn
}

func newWireConn(fd int, name string) (*wireConn, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &wireConn{f: f, rc: rc}, nil
}

func (c *wireConn) close() error { return c.f.Close() }

// open reports whether the process at the other end still holds the
// connection: the kernel hangs it up when that process exits, however it
// dies, and no read is needed to see it (so a reader elsewhere loses
// nothing).
func (c *wireConn) open() bool {
	hung := true
	_ = c.rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(p, 0)
		hung = err == nil && n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		if err != nil && err != unix.EINTR {
			hung = true
		}
	})
	return !hung
}

// peer returns the credentials of the process at the other end, as the
// kernel recorded them at connect time.
func (c *wireConn) peer() (*unix.Ucred, error) {
	var cred *unix.Ucred
	var err error
	if cerr := c.rc.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); cerr != nil {
		return nil, cerr
	}
	return cred, err
}

// send writes m with fds attached.
func (c *wireConn) send(m wireMsg, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	var serr error
	if err := c.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), b, oob, nil, unix.MSG_NOSIGNAL)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}

// recv reads one message and the descriptors it carries, waiting at most
// until deadline (zero: no limit). The caller owns the descriptors.
func (c *wireConn) recv(deadline time.Time) (wireMsg, []int, error) {
	if err := c.f.SetReadDeadline(deadline); err != nil {
		return wireMsg{}, nil, err
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*maxWireFDs))
	var n, oobn, flags int
	var rerr error
	if err := c.rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	}); err != nil {
		return wireMsg{}, nil, err
	}
	if rerr != nil {
		return wireMsg{}, nil, rerr
	}
	fds, err := parseRights(oob[:oobn])
	if err == nil && flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0 {
		err = fmt.Errorf("%w: message truncated", ErrProtocol)
	}
	if err == nil && n == 0 {
		err = io.EOF
	}
	var m wireMsg
	if err == nil {
		if jerr := json.Unmarshal(buf[:n], &m); jerr != nil {
			err = fmt.Errorf("%w: %v", ErrProtocol, jerr)
		}
	}
	if err != nil {
		closeAll(fds)
		return wireMsg{}, nil, err
	}
	return m, fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %v", ErrProtocol, err)
	}
	var fds []int
	for i := range msgs {
		r, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("%w: control message: %v", ErrProtocol, err)
		}
		fds = append(fds, r...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
