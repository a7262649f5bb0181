package e2e

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	pb "github.com/recmesh/recmesh/proto/inference"
)

// h2raw is one hand-driven HTTP/2 client connection for make e2e-abuse:
// golang.org/x/net/http2's Framer over raw TCP, so an attack can send
// exactly the frames a hostile client would (resets right after HEADERS,
// header blocks that reference one entry thousands of times, CONTINUATION
// without end, bodies that never finish) while still honouring what a
// server may legitimately use against it: its SETTINGS and flow-control
// windows. A reader goroutine answers SETTINGS and PING and records how
// the server ended each stream and the connection.
type h2raw struct {
	nc net.Conn
	fr *http2.Framer

	wmu    sync.Mutex // one writer; the HPACK encoder's state follows the write order
	enc    *hpack.Encoder
	encBuf bytes.Buffer

	mu            sync.Mutex
	cond          *sync.Cond
	settings      bool   // the server's first SETTINGS arrived
	maxFrame      uint32 // the server's SETTINGS_MAX_FRAME_SIZE
	headerTable   uint32 // the server's SETTINGS_HEADER_TABLE_SIZE (its decoder's table)
	maxHeaderList uint32 // the server's SETTINGS_MAX_HEADER_LIST_SIZE; 0: not advertised
	initWin       int64
	connWin       int64
	streamWin     map[uint32]int64
	ended         map[uint32]string // stream → "rst:CODE" or "grpc-status:N" / "http-status:N"
	rsts          int
	goAway        string // "CODE debug" of the server's GOAWAY, if any
	readErr       error  // why the reader stopped: the connection is gone
}

// h2WriteTimeout bounds every frame write: a server that stops reading
// must not hang an attack.
const h2WriteTimeout = 5 * time.Second

// dialH2 connects, sends the preface and a SETTINGS frame with a large
// receive window (so responses are never held up by us), and waits for
// the server's SETTINGS.
func dialH2(addr string) (*h2raw, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	h := &h2raw{
		nc: nc, fr: http2.NewFramer(nc, nc),
		maxFrame: 16384, headerTable: 4096, initWin: 65535, connWin: 65535,
		streamWin: map[uint32]int64{}, ended: map[uint32]string{},
	}
	h.cond = sync.NewCond(&h.mu)
	h.enc = hpack.NewEncoder(&h.encBuf)
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.fr.MaxHeaderListSize = 1 << 20
	err = h.write(func() error {
		if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
			return err
		}
		if err := h.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
			return err
		}
		return h.fr.WriteWindowUpdate(0, 1<<30-65535)
	})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("preface to %s: %w", addr, err)
	}
	go h.readLoop()
	if err := h.waitFor(5*time.Second, func() bool { return h.settings }); err != nil {
		nc.Close()
		return nil, fmt.Errorf("the server's SETTINGS from %s: %w", addr, err)
	}
	return h, nil
}

func (h *h2raw) close() { h.nc.Close() }

// write runs fn, which writes frames, under the write lock with a deadline.
func (h *h2raw) write(fn func() error) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	if err := h.nc.SetWriteDeadline(time.Now().Add(h2WriteTimeout)); err != nil {
		return err
	}
	return fn()
}

// waitFor waits until cond (called with h.mu held) holds, the connection
// is gone (an error) or d passes (an error).
func (h *h2raw) waitFor(d time.Duration, cond func() bool) error {
	timedOut := false
	t := time.AfterFunc(d, func() {
		h.mu.Lock()
		timedOut = true
		h.cond.Broadcast()
		h.mu.Unlock()
	})
	defer t.Stop()
	h.mu.Lock()
	defer h.mu.Unlock()
	for !cond() {
		switch {
		case h.readErr != nil:
			return fmt.Errorf("connection gone: %w", h.readErr)
		case timedOut:
			return fmt.Errorf("not within %v", d)
		}
		h.cond.Wait()
	}
	return nil
}

func (h *h2raw) readLoop() {
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.mu.Lock()
			h.readErr = err
			h.cond.Broadcast()
			h.mu.Unlock()
			return
		}
		var reply func() error
		h.mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				break
			}
			_ = f.ForeachSetting(func(s http2.Setting) error {
				switch s.ID {
				case http2.SettingMaxFrameSize:
					h.maxFrame = s.Val
				case http2.SettingHeaderTableSize:
					h.headerTable = s.Val
				case http2.SettingMaxHeaderListSize:
					h.maxHeaderList = s.Val
				case http2.SettingInitialWindowSize:
					delta := int64(s.Val) - h.initWin
					h.initWin = int64(s.Val)
					for id := range h.streamWin {
						h.streamWin[id] += delta
					}
				}
				return nil
			})
			h.settings = true
			reply = func() error { return h.fr.WriteSettingsAck() }
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				h.connWin += int64(f.Increment)
			} else if _, ok := h.streamWin[f.StreamID]; ok {
				h.streamWin[f.StreamID] += int64(f.Increment)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				data := f.Data
				reply = func() error { return h.fr.WritePing(true, data) }
			}
		case *http2.GoAwayFrame:
			h.goAway = fmt.Sprintf("%v %q", f.ErrCode, f.DebugData())
		case *http2.RSTStreamFrame:
			h.rsts++
			// A gRPC server ends a call with its trailers and then resets
			// what the client had not closed: the trailers say more.
			if e := h.ended[f.StreamID]; e == "" || e == "ended" {
				h.ended[f.StreamID] = "rst:" + f.ErrCode.String()
			}
		case *http2.MetaHeadersFrame:
			if s := f.PseudoValue("status"); s != "" && s != "200" {
				h.ended[f.StreamID] = "http-status:" + s
			}
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					h.ended[f.StreamID] = "grpc-status:" + hf.Value
				}
			}
			if f.StreamEnded() && h.ended[f.StreamID] == "" {
				h.ended[f.StreamID] = "ended"
			}
		}
		h.cond.Broadcast()
		h.mu.Unlock()
		if reply != nil {
			_ = h.write(reply)
		}
	}
}

// gone reports whether the server closed the connection (or sent GOAWAY).
func (h *h2raw) gone() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.readErr != nil || h.goAway != ""
}

// outcome says how the server treated the connection, for the logs.
func (h *h2raw) outcome() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := fmt.Sprintf("rst=%d", h.rsts)
	if h.goAway != "" {
		s += " goaway=" + strconv.Quote(h.goAway)
	}
	if h.readErr != nil {
		s += " closed"
	}
	return s
}

// streamEnded returns how the server ended stream id, "" while it has not.
func (h *h2raw) streamEnded(id uint32) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended[id]
}

// grpcHeaders are the fields of a ModelInfer call. They are marked
// sensitive (never indexed), so they leave the HPACK dynamic table to what
// an attack puts in it.
func grpcHeaders(addr string) []hpack.HeaderField {
	fs := []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: pb.GRPCInferenceService_ModelInfer_FullMethodName},
		{Name: ":authority", Value: addr},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	}
	for i := range fs {
		fs[i].Sensitive = true
	}
	return fs
}

// writeHeaders encodes fields with the connection's encoder and sends
// them on stream id as HEADERS plus as many CONTINUATION frames as the
// server's frame size needs.
func (h *h2raw) writeHeaders(id uint32, fields []hpack.HeaderField, endStream bool) error {
	h.mu.Lock()
	if _, ok := h.streamWin[id]; !ok {
		h.streamWin[id] = h.initWin
	}
	max := int(h.maxFrame)
	table := h.headerTable
	h.mu.Unlock()
	return h.write(func() error {
		if table < 4096 {
			// The server's decoder keeps a smaller table than the
			// encoder's default: index only what it can hold.
			h.enc.SetMaxDynamicTableSizeLimit(table)
		}
		h.encBuf.Reset()
		for _, f := range fields {
			if err := h.enc.WriteField(f); err != nil {
				return fmt.Errorf("hpack: %w", err)
			}
		}
		block := h.encBuf.Bytes()
		first := block[:min(len(block), max)]
		rest := block[len(first):]
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: endStream, EndHeaders: len(rest) == 0}); err != nil {
			return err
		}
		for len(rest) > 0 {
			n := min(len(rest), max)
			if err := h.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
				return err
			}
			rest = rest[n:]
		}
		return nil
	})
}

// errStreamEnded says the server ended a stream we were still sending on.
var errStreamEnded = errors.New("stream ended by the server")

// writeData sends data on stream id within the server's flow-control
// windows, waiting at most stall for each grant; endStream closes the
// stream with the last frame.
func (h *h2raw) writeData(id uint32, data []byte, endStream bool, stall time.Duration) error {
	for first := true; first || len(data) > 0; first = false {
		n, err := h.reserve(id, len(data), stall)
		if err != nil {
			return err
		}
		chunk := data[:n]
		data = data[n:]
		end := endStream && len(data) == 0
		if err := h.write(func() error { return h.fr.WriteData(id, end, chunk) }); err != nil {
			return err
		}
	}
	return nil
}

// reserve takes up to want bytes of both windows for stream id (at most
// a frame), waiting at most stall for a grant; want 0 reserves nothing.
func (h *h2raw) reserve(id uint32, want int, stall time.Duration) (int, error) {
	if want == 0 {
		return 0, nil
	}
	var n int
	var ended string
	err := h.waitFor(stall, func() bool {
		if ended = h.ended[id]; ended != "" {
			return true
		}
		n = int(min(int64(want), int64(h.maxFrame), h.connWin, h.streamWin[id]))
		if n <= 0 {
			return false
		}
		// Taken while the lock is held, so writers of other streams on
		// this connection never overdraw the connection's window.
		h.connWin -= int64(n)
		h.streamWin[id] -= int64(n)
		return true
	})
	if err != nil {
		return 0, fmt.Errorf("flow-control window for stream %d: %w", id, err)
	}
	if ended != "" {
		return 0, fmt.Errorf("%w (%s)", errStreamEnded, ended)
	}
	return n, nil
}

// available is how many bytes stream id may send now, without waiting.
func (h *h2raw) available(id uint32) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended[id] != "" {
		return 0
	}
	return int(max(0, min(int64(h.maxFrame), h.connWin, h.streamWin[id])))
}

func (h *h2raw) writeRST(id uint32, code http2.ErrCode) error {
	return h.write(func() error { return h.fr.WriteRSTStream(id, code) })
}

// grpcMessage is req as a gRPC length-prefixed message.
func grpcMessage(req *pb.ModelInferRequest) ([]byte, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("marshal the request: %w", err)
	}
	return append(grpcPrefix(0, uint32(len(b))), b...), nil
}

// grpcPrefix is a gRPC message prefix: the compressed flag and the length.
func grpcPrefix(flag byte, n uint32) []byte {
	p := make([]byte, 5)
	p[0] = flag
	binary.BigEndian.PutUint32(p[1:], n)
	return p
}
