package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// honestBound is an honest call's deadline: generous, so on a loaded
// 2-core machine a slow answer is still an answer, and a call that fails
// failed for a reason.
const honestBound = 10 * time.Second

// honestPerFrontend is how many honest clients call each frontend.
const honestPerFrontend = 2

// honestValue is what honest calls to one frontend came to.
type honestValue struct {
	calls, ok, failed, wrong, unavailable int64
	codes                                 map[codes.Code]int64
}

type honestCounts struct {
	calls, ok, failed, wrong, unavailable atomic.Int64
	mu                                    sync.Mutex
	codes                                 map[codes.Code]int64
}

// honestLoad is the honest clients: plain grpc-go on the generated stubs,
// honestPerFrontend per frontend, calling one after another from the start
// of the run to its end, every score checked against the reference.
type honestLoad struct {
	t   *testing.T
	w   *workload
	per map[string]*honestCounts // by frontend name
	// extraWrong counts wrong scores seen outside the honest clients:
	// by the recovery probes and by the storm's callers that got an answer.
	extraWrong atomic.Int64
	logged     atomic.Int64
	done       chan struct{}
	wg         sync.WaitGroup
	once       sync.Once
}

func startHonest(t *testing.T, w *workload, fronts []*abuseFrontend) *honestLoad {
	l := &honestLoad{t: t, w: w, per: map[string]*honestCounts{}, done: make(chan struct{})}
	for _, f := range fronts {
		hc := &honestCounts{codes: map[codes.Code]int64{}}
		l.per[f.name] = hc
		for k := 0; k < honestPerFrontend; k++ {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.callLoop(f, hc, k)
			}()
		}
	}
	return l
}

func (l *honestLoad) stop() { l.once.Do(func() { close(l.done); l.wg.Wait() }) }

// callLoop calls f until the load stops. After a failure it dials afresh
// (a restarted frontend's old connection is gone) after a 10 ms pause, so
// a dead port is not spun on.
func (l *honestLoad) callLoop(f *abuseFrontend, hc *honestCounts, first int) {
	var conn *grpc.ClientConn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for k := first; ; k++ {
		select {
		case <-l.done:
			return
		default:
		}
		i := k % len(l.w.reqs)
		if l.w.n[i] > 16 {
			continue
		}
		if conn == nil {
			var err error
			if conn, err = grpc.NewClient(f.addr(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
				l.t.Errorf("honest client for %s: %v", f.transport, err)
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), honestBound)
		resp, err := pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, l.w.reqs[i])
		cancel()
		hc.calls.Add(1)
		if err != nil {
			code := status.Code(err)
			hc.failed.Add(1)
			if code == codes.Unavailable {
				hc.unavailable.Add(1)
			}
			hc.mu.Lock()
			hc.codes[code]++
			hc.mu.Unlock()
			conn.Close()
			conn = nil
			select {
			case <-l.done:
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if err := checkScore(l.w, i, resp); err != nil {
			hc.wrong.Add(1)
			if l.logged.Add(1) <= 20 {
				l.t.Errorf("honest call to %s, request %d (B=%d): %v", f.transport, i, l.w.n[i], err)
			}
			continue
		}
		hc.ok.Add(1)
	}
}

// checkScore compares resp with the reference's scores of request i.
func checkScore(w *workload, i int, resp *pb.ModelInferResponse) error {
	got, err := oip.Scores(resp, w.n[i])
	if err != nil {
		return fmt.Errorf("bad response: %w", err)
	}
	if d := maxAbsDiff(got, w.want[i]); d > 1e-4 {
		return fmt.Errorf("wrong scores: max|Δ| %g from the reference", d)
	}
	return nil
}

// allServing reports whether every frontend has answered a few honest
// calls correctly.
func (l *honestLoad) allServing() bool {
	for _, hc := range l.per {
		if hc.ok.Load() < 5 {
			return false
		}
	}
	return true
}

func (l *honestLoad) wrongTotal() int64 {
	n := l.extraWrong.Load()
	for _, hc := range l.per {
		n += hc.wrong.Load()
	}
	return n
}

// honestSnap is every frontend's honest counts at one moment.
type honestSnap map[string]honestValue

func (l *honestLoad) snapshot() honestSnap {
	s := honestSnap{}
	for name, hc := range l.per {
		v := honestValue{calls: hc.calls.Load(), ok: hc.ok.Load(), failed: hc.failed.Load(),
			wrong: hc.wrong.Load(), unavailable: hc.unavailable.Load(), codes: map[codes.Code]int64{}}
		hc.mu.Lock()
		for c, n := range hc.codes {
			v.codes[c] = n
		}
		hc.mu.Unlock()
		s[name] = v
	}
	return s
}

// minus is what happened between b and s.
func (s honestSnap) minus(b honestSnap) honestSnap {
	d := honestSnap{}
	for name, v := range s {
		o := b[name]
		x := honestValue{calls: v.calls - o.calls, ok: v.ok - o.ok, failed: v.failed - o.failed,
			wrong: v.wrong - o.wrong, unavailable: v.unavailable - o.unavailable, codes: map[codes.Code]int64{}}
		for c, n := range v.codes {
			if n-o.codes[c] != 0 {
				x.codes[c] = n - o.codes[c]
			}
		}
		d[name] = x
	}
	return d
}

// split sums s into the attacked frontend's counts and the others'; with
// no frontend attacked (a mesh-wide attack), all of them are the target.
func (s honestSnap) split(f *abuseFrontend) (target, other honestValue) {
	for name, v := range s {
		p := &other
		if f == nil || f.name == name {
			p = &target
		}
		p.calls += v.calls
		p.ok += v.ok
		p.failed += v.failed
		p.wrong += v.wrong
		p.unavailable += v.unavailable
	}
	return target, other
}

// codes lists the honest failures by frontend and code.
func (s honestSnap) codes() string {
	var parts []string
	for name, v := range s {
		for c, n := range v.codes {
			parts = append(parts, fmt.Sprintf("%s:%s=%d", strings.TrimPrefix(name, "frontend-"), oip.CodeName(c), n))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// probeUntil calls addr afresh until a call returns the reference's
// scores or the deadline passes. A wrong score counts in wrong.
func probeUntil(addr string, w *workload, deadline time.Time, wrong *atomic.Int64) error {
	i := 0 // the first request of the workload, B = 1
	var last error
	for {
		last = probeOnce(addr, w, i, min(3*time.Second, max(time.Until(deadline), 100*time.Millisecond)))
		if last == nil {
			return nil
		}
		if strings.Contains(last.Error(), "wrong scores") {
			wrong.Add(1)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no correct answer from %s: last call: %w", addr, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func probeOnce(addr string, w *workload, i int, bound time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	resp, err := pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, w.reqs[i])
	if err != nil {
		return err
	}
	return checkScore(w, i, resp)
}

// rssSampler records each frontend's highest VmRSS, every 100 ms.
type rssSampler struct {
	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	peak  map[string]float64 // MiB, by frontend name
	first map[string]float64 // the first sample: the RSS the attack began from
}

func startRSSSampler(c *cluster, fronts []*abuseFrontend) *rssSampler {
	pids := map[string]int{}
	for _, f := range fronts {
		if p, ok := c.procs[f.name]; ok {
			pids[f.name] = p.cmd.Process.Pid
		}
	}
	s := &rssSampler{stopc: make(chan struct{}), done: make(chan struct{}), peak: map[string]float64{}, first: map[string]float64{}}
	sample := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for name, pid := range pids {
			if v, ok := vmRSSMiB(pid); ok {
				s.peak[name] = max(s.peak[name], v)
			}
		}
	}
	sample()
	for name, v := range s.peak {
		s.first[name] = v
	}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stopc:
				sample()
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	return s
}

func (s *rssSampler) stop() map[string]float64 {
	close(s.stopc)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// vmRSSMiB reads a process's resident set size from /proc/<pid>/status.
func vmRSSMiB(pid int) (float64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
					return kb / 1024, true
				}
			}
		}
	}
	return 0, false
}

// formatRSS is each frontend's peak, for the log line.
func formatRSS(peak map[string]float64) string {
	var parts []string
	for name, v := range peak {
		parts = append(parts, fmt.Sprintf("%s:%.0f", strings.TrimPrefix(name, "frontend-"), v))
	}
	sort.Strings(parts)
	return "rss_by_frontend=" + strings.Join(parts, ",")
}
