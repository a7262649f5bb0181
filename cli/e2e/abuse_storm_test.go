package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// The deadline storm: stormCallers callers with deadlines of 0.2 to 3 ms,
// which expire anywhere on a call's way (in the frontend's queue, in the
// lane, while the accelerator runs the batch), and stormCancelers that
// cancel each call right after sending it.
const (
	stormCallers   = 16
	stormCancelers = 8
	stormConns     = 4
)

// deadlineStorm runs the storm against f for RECMESH_ABUSE_STORM_SECONDS
// (12). A call the storm's callers see answered must still carry the
// reference's scores: an expired call's slot handed to the next caller
// would show here.
func (a *abuseRun) deadlineStorm(t *testing.T, f *abuseFrontend) (string, error) {
	d := time.Duration(envInt("RECMESH_ABUSE_STORM_SECONDS", 12)) * time.Second
	conns := make([]*grpc.ClientConn, stormConns)
	for i := range conns {
		c, err := grpc.NewClient(f.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return "", fmt.Errorf("storm client: %w", err)
		}
		defer c.Close()
		conns[i] = c
	}
	var small []int // the requests of up to 16 examples
	for i, n := range a.w.n {
		if n <= 16 {
			small = append(small, i)
		}
	}
	var mu sync.Mutex
	byCode := map[codes.Code]int{}
	var answered, wrong atomic.Int64
	outcome := func(i int, resp *pb.ModelInferResponse, err error) {
		if err != nil {
			mu.Lock()
			byCode[status.Code(err)]++
			mu.Unlock()
			return
		}
		answered.Add(1)
		if err := checkScore(a.w, i, resp); err != nil {
			wrong.Add(1)
			a.honest.extraWrong.Add(1)
			if wrong.Load() <= 5 {
				t.Errorf("deadline storm on %s: an answered call, request %d: %v", f.transport, i, err)
			}
		}
	}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for k := 0; k < stormCallers+stormCancelers; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(k), 0x5eed))
			client := pb.NewGRPCInferenceServiceClient(conns[k%stormConns])
			for time.Now().Before(end) {
				i := small[rng.IntN(len(small))]
				if k < stormCallers {
					dl := 200*time.Microsecond + time.Duration(rng.Int64N(int64(2800*time.Microsecond)))
					ctx, cancel := context.WithTimeout(context.Background(), dl)
					resp, err := client.ModelInfer(ctx, a.w.reqs[i])
					cancel()
					outcome(i, resp, err)
					continue
				}
				resp, err := sendThenCancel(conns[k%stormConns], a.w.reqs[i])
				outcome(i, resp, err)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	total := answered.Load()
	var codeList []string
	for c, n := range byCode {
		total += int64(n)
		codeList = append(codeList, fmt.Sprintf("%s:%d", oip.CodeName(c), n))
	}
	sort.Strings(codeList)
	return fmt.Sprintf("storm_calls=%d storm_answered=%d storm_wrong=%d storm_codes=%s", total, answered.Load(), wrong.Load(), strings.Join(codeList, ",")), nil
}

// sendThenCancel sends one ModelInfer call and cancels it as soon as the
// request is written, then reads whatever comes back (the cancellation,
// or an answer that won the race).
func sendThenCancel(conn *grpc.ClientConn, req *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), honestBound)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{StreamName: "ModelInfer"}, pb.GRPCInferenceService_ModelInfer_FullMethodName)
	if err != nil {
		return nil, err
	}
	if err := st.SendMsg(req); err != nil {
		return nil, err
	}
	_ = st.CloseSend()
	cancel()
	resp := new(pb.ModelInferResponse)
	if err := st.RecvMsg(resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// dribble opens RECMESH_ABUSE_DRIBBLE_CONNS (1,000) connections to f that
// send the client preface at once and then a valid call one byte at a
// time, a byte per connection every 250 ms, for
// RECMESH_ABUSE_DRIBBLE_SECONDS (10): a slowloris, which costs the
// attacker nothing and must not cost the frontend more than a
// connection's worth each.
func (a *abuseRun) dribble(t *testing.T, f *abuseFrontend) (string, error) {
	n := envInt("RECMESH_ABUSE_DRIBBLE_CONNS", 1000)
	d := time.Duration(envInt("RECMESH_ABUSE_DRIBBLE_SECONDS", 10)) * time.Second
	script, err := dribbleScript(a.w, f.addr())
	if err != nil {
		return "", err
	}
	type dconn struct {
		nc     net.Conn
		closed atomic.Bool
	}
	var conns []*dconn
	var readers sync.WaitGroup
	var closedByServer atomic.Int64
	dialFailed := 0
	var firstErr error
	defer func() {
		for _, c := range conns {
			c.nc.Close()
		}
		readers.Wait()
	}()
	// A server whose accept queue is full makes each dial wait out its
	// timeout: the dialling as a whole is bounded too.
	dialEnd := time.Now().Add(30 * time.Second)
	for i := 0; i < n; i++ {
		if time.Now().After(dialEnd) {
			dialFailed += n - i
			if firstErr == nil {
				firstErr = fmt.Errorf("dialling stopped after 30 s at %d connections", i)
			}
			break
		}
		nc, err := net.DialTimeout("tcp", f.addr(), 2*time.Second)
		if err == nil {
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, err = nc.Write([]byte(http2.ClientPreface))
		}
		if err != nil {
			dialFailed++
			if firstErr == nil {
				firstErr = err
			}
			if nc != nil {
				nc.Close()
			}
			continue
		}
		c := &dconn{nc: nc}
		conns = append(conns, c)
		readers.Add(1)
		go func() {
			defer readers.Done()
			// Whatever the server sends is read and dropped; the read
			// ends when the server closes the connection (or we do).
			_, _ = io.Copy(io.Discard, nc)
			if !c.closed.Swap(true) {
				closedByServer.Add(1)
			}
		}()
	}
	if len(conns) == 0 {
		return "", fmt.Errorf("no connection to %s: %v", f.addr(), firstErr)
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	sent := 0
	for end := time.Now().Add(d); time.Now().Before(end) && sent < len(script); sent++ {
		<-tick.C
		for _, c := range conns {
			if c.closed.Load() {
				continue
			}
			_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := c.nc.Write(script[sent : sent+1]); err != nil && !c.closed.Swap(true) {
				closedByServer.Add(1)
			}
		}
	}
	closed := closedByServer.Load()
	for _, c := range conns {
		c.closed.Store(true) // from here on, we close them
	}
	return fmt.Sprintf("conns=%d dial_failed=%d closed_by_server=%d bytes_each=%d first_dial_err=%q",
		len(conns), dialFailed, closed, sent, errString(firstErr)), nil
}

// dribbleScript is what a dribbling connection sends after the preface:
// an empty SETTINGS frame, then the HEADERS and DATA of a B = 1 call.
func dribbleScript(w *workload, addr string) ([]byte, error) {
	var buf, hbuf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	if err := fr.WriteSettings(); err != nil {
		return nil, err
	}
	enc := hpack.NewEncoder(&hbuf)
	for _, hf := range grpcHeaders(addr) {
		if err := enc.WriteField(hf); err != nil {
			return nil, err
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hbuf.Bytes(), EndHeaders: true}); err != nil {
		return nil, err
	}
	msg, err := grpcMessage(w.reqs[0])
	if err != nil {
		return nil, err
	}
	if err := fr.WriteData(1, true, msg); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
