package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/bench/cpuset"
	"github.com/recmesh/recmesh/bench/internal/oiptest"
	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/model"
)

// TestMain lets the test binary stand in for loadgen where loadgen runs
// itself: run -stall-cpus starts `<its executable> stall-probe`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "stall-probe" {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	t.Logf("loadgen %s\n%s%s", strings.Join(args, " "), out.String(), errOut.String())
	return out.String(), err
}

func TestRunWritesPoint(t *testing.T) {
	srv := oiptest.Start(t, model.DLRMv2(model.DevVocabCap), oiptest.Options{})
	path := filepath.Join(t.TempDir(), "point.json")
	out, err := runCLI(t, "run", "-target", srv.Addr, "-max-vocab", "1000", "-batch", "2", "-concurrency", "3",
		"-warmup", "100ms", "-duration", "300ms", "-repeats", "2", "-pool", "8", "-arm", "fake",
		"-monitor-pids", strconv.Itoa(os.Getpid()), "-monitor-descendants=false", "-monitor-interval", "50ms", "-out", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "run 2/2: closed B=2 C=3 conns=3") || !strings.Contains(out, "server:") {
		t.Errorf("output lacks the per-run lines")
	}
	p, err := loadgen.ReadPoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if p.Arm != "fake" || p.Mode != loadgen.Closed || p.BatchSize != 2 || p.Concurrency != 3 || p.Connections != 3 ||
		p.PoolRequests != 8 || p.Bundle != "max-vocab=1000" || len(p.Runs) != 2 || p.Summary.Repeats != 2 {
		t.Errorf("point %+v", p)
	}
	for _, r := range p.Runs {
		if r.OK == 0 || r.Errors != 0 || r.Monitor == nil || r.Monitor.Examples != 2*r.CompletedInWindow {
			t.Errorf("run %d: ok %d errors %d monitor %+v", r.Repeat, r.OK, r.Errors, r.Monitor)
		}
	}
	if p.Summary.ServerCPUCores <= 0 || p.Summary.ExamplesPerS <= 0 {
		t.Errorf("summary %+v", p.Summary)
	}
}

func TestRunOpenLoop(t *testing.T) {
	srv := oiptest.Start(t, model.DLRMv2(model.DevVocabCap), oiptest.Options{})
	path := filepath.Join(t.TempDir(), "open.json")
	if _, err := runCLI(t, "-mode", "open", "-rate", "200", "-target", srv.Addr, "-max-vocab", "1000", "-batch", "1",
		"-warmup", "0s", "-duration", "500ms", "-out", path); err != nil {
		t.Fatal(err)
	}
	p, err := loadgen.ReadPoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != loadgen.Open || p.RateRPS != 200 || p.Connections != 64 || p.Concurrency != 0 || p.Runs[0].Scheduled == 0 {
		t.Errorf("point %+v", p)
	}
}

// TestRunWatchesStalls: -stall-cpus runs a stall probe on each CPU over
// each measured window, the last CPU's with the memory probe
// (-memory-probe-mib), and records what they saw beside the run.
func TestRunWatchesStalls(t *testing.T) {
	srv := oiptest.Start(t, model.DLRMv2(model.DevVocabCap), oiptest.Options{})
	path := filepath.Join(t.TempDir(), "stalls.json")
	// The first and the last CPU this process may use (a container's
	// cpuset need not hold CPU 0).
	allowed, err := cpuset.Current()
	if err != nil {
		t.Fatal(err)
	}
	all := cpuset.CPUs(allowed)
	want := []int{all[0]}
	if len(all) > 1 {
		want = append(want, all[len(all)-1])
	}
	cpus := fmt.Sprint(want[0])
	if len(want) > 1 {
		cpus += "," + fmt.Sprint(want[1])
	}
	out, err := runCLI(t, "run", "-target", srv.Addr, "-max-vocab", "1000", "-batch", "1", "-concurrency", "2",
		"-warmup", "100ms", "-duration", "400ms", "-repeats", "2", "-pool", "4", "-stall-cpus", cpus, "-memory-probe-mib", "4", "-out", path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out, "memory load latency p50 "); got != 2 {
		t.Errorf("%d memory latency reports in the output, want one per run:\n%s", got, out)
	}
	if got := strings.Count(out, fmt.Sprintf("host: CPU %d stalls: max ", want[0])); got != 2 {
		t.Errorf("%d host lines for CPU %d in the output, want one per run", got, want[0])
	}
	p, err := loadgen.ReadPoint(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.Runs {
		if len(r.Stalls) != len(want) {
			t.Fatalf("run %d: %d stall reports, want %d", r.Repeat, len(r.Stalls), len(want))
		}
		for i, st := range r.Stalls {
			// 1 ms wake-ups over a 0.4 s window: hundreds, or fewer with
			// delays that make up the window on a busy machine; steal -1
			// when the probe ran too briefly for /proc/stat to tick.
			if st == nil {
				t.Fatalf("run %d: no stall report of CPU %d", r.Repeat, want[i])
			}
			covered := float64(st.Wakeups)*st.PeriodMs + st.LateMs
			if st.CPU != want[i] || st.Wakeups < 1 || st.WallS < 0.35 || covered < 0.9*st.WallS*1000-5 || st.StealPct < -1 {
				t.Errorf("run %d: stalls of CPU %d: %+v", r.Repeat, want[i], st)
			}
			if last := i == len(want)-1; last != (st.Memory != nil) || last && (st.Memory.Bursts < 1 || st.Memory.BufferMiB != 4) {
				t.Errorf("run %d: memory probe of CPU %d: %+v, want one over 4 MiB on the last CPU only", r.Repeat, want[i], st.Memory)
			}
		}
	}
}

func TestParityCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := model.Export(context.Background(), dir, model.DLRMv2(model.DevVocabCap), 1, nil); err != nil {
		t.Fatal(err)
	}
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ref, err := model.NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	good := oiptest.Start(t, b.Config, oiptest.Options{Scores: ref.Predict})
	jsonPath := filepath.Join(t.TempDir(), "parity.json")
	if _, err := runCLI(t, "parity", "-target", good.Addr, "-bundle", dir, "-examples", "10", "-batch-sizes", "1,4", "-json", jsonPath); err != nil {
		t.Errorf("parity against the reference itself: %v", err)
	}
	if b, err := os.ReadFile(jsonPath); err != nil || !bytes.Contains(b, []byte(`"pass": true`)) {
		t.Errorf("parity JSON %s, %v", b, err)
	}
	// The fake's default answer, 0.5 for everything, is far off.
	bad := oiptest.Start(t, b.Config, oiptest.Options{})
	if _, err := runCLI(t, "parity", "-target", bad.Addr, "-bundle", dir, "-examples", "4"); err == nil || !strings.Contains(err.Error(), "parity failed") {
		t.Errorf("parity against constant scores: err %v", err)
	}
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"bench"},
		{"run", "-mode", "sideways"},
		{"run", "-mode", "open"},
		{"run", "-concurrency", "0"},
		{"run", "-max-vocab", "1000", "-target", "127.0.0.1:1", "-ready-timeout", "100ms"},
		{"run", "-repeats", "0"},
		{"run", "-monitor-pids", "x"},
		{"run", "-cpus", "zero"},
		{"run", "extra"},
		{"parity", "-batch-sizes", "1,0"},
		{"run", "-bundle", "/nonexistent"},
		{"run", "-stall-cpus", "4096"},
		{"run", "-stall-cpus", "zero"},
		{"run", "-memory-probe-mib", "-1", "-stall-cpus", "0"},
		{"run", "-memory-probe-mib", "64"},
		{"stall-probe"},
		{"stall-probe", "-cpu", "4096"},
	} {
		if _, err := runCLI(t, args...); err == nil {
			t.Errorf("loadgen %v succeeded", args)
		}
	}
}
