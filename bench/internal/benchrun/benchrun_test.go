package benchrun

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/recmesh/recmesh/bench/cpuset"
	"github.com/recmesh/recmesh/bench/internal/oiptest"
	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/bench/stall"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

// TestMain lets the test binary stand in for benchrun where benchrun runs
// itself: loadgen.Measure starts `<its executable> stall-probe` per watched CPU.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == stall.ProbeCommand {
		if err := Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, nil); err != nil {
			fmt.Fprintln(os.Stderr, "benchrun:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestDefaultStallCPUs(t *testing.T) {
	for _, c := range []struct{ server, client, want string }{
		{"0", "1", "0,1"},
		{"0-17", "18-23", "0,18"},
		{"", "", ""},
		{"2-3", "", "2"},
	} {
		if got := defaultStallCPUs(c.server, c.client); got != c.want {
			t.Errorf("defaultStallCPUs(%q, %q) = %q, want %q", c.server, c.client, got, c.want)
		}
	}
}

// pointFixture starts an in-process server and a pool of conns lean
// connections to it, with a small B_req 1 workload, and returns them with
// the first CPU this test may use.
func pointFixture(t *testing.T, conns int) (*oiptest.Server, loadgen.Client, *loadgen.Workload, int) {
	t.Helper()
	cfg := model.DLRMv2(model.DevVocabCap)
	srv := oiptest.Start(t, cfg, oiptest.Options{})
	pool, err := loadgen.Dial(context.Background(), loadgen.ClientLean, srv.Addr, oip.DefaultModelName, conns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	w, err := loadgen.NewWorkload(cfg, loadgen.WorkloadOptions{BatchSize: 1, Seed: 1, PoolRequests: 4})
	if err != nil {
		t.Fatal(err)
	}
	allowed, err := cpuset.Current()
	if err != nil {
		t.Fatal(err)
	}
	return srv, pool, w, cpuset.CPUs(allowed)[0]
}

// TestMeasureWatchesStalls: with stall CPUs, every measured window has a
// probe's report per CPU beside it, and the point's line names the worst.
func TestMeasureWatchesStalls(t *testing.T) {
	ctx := context.Background()
	srv, pool, w, cpu := pointFixture(t, 2)
	var out strings.Builder
	c := &config{out: &out, stalls: stallConfig{cpus: []int{cpu}}}
	rc := loadgen.Config{Mode: loadgen.Closed, Concurrency: 2, Warmup: 50 * time.Millisecond, Duration: 300 * time.Millisecond, Timeout: 5 * time.Second}
	p, err := c.point(ctx, "test-arm", report.LabelClosed, &server{addr: srv.Addr, pid: os.Getpid()}, pool, w, rc, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.Runs {
		if len(r.Stalls) != 1 || r.Stalls[0] == nil || r.Stalls[0].CPU != cpu || r.Stalls[0].Wakeups < 1 || r.Stalls[0].WallS < 0.29 {
			t.Fatalf("run %d: stall reports %+v, want one of CPU %d with its wake-ups", r.Repeat, r.Stalls, cpu)
		}
	}
	if !strings.Contains(out.String(), "host stall max ") || !strings.Contains(out.String(), fmt.Sprintf("(CPU %d)", cpu)) {
		t.Errorf("point line %q does not report the probe", out.String())
	}
}

func TestDefaultCPUs(t *testing.T) {
	for n, want := range map[int][2]string{1: {"", ""}, 2: {"0", "1"}, 4: {"0-2", "3-3"}, 24: {"0-17", "18-23"}} {
		s, c := defaultCPUs(n)
		if s != want[0] || c != want[1] {
			t.Errorf("defaultCPUs(%d) = %q, %q, want %q, %q", n, s, c, want[0], want[1])
		}
	}
}

func TestLists(t *testing.T) {
	if v, err := intList("-x", " 1, 16,128 "); err != nil || !slices.Equal(v, []int{1, 16, 128}) {
		t.Errorf("intList = %v, %v", v, err)
	}
	if _, err := intList("-x", "1,0"); err == nil {
		t.Error("intList accepted 0")
	}
	if v, err := floatList("-x", "0.5,0.8"); err != nil || !slices.Equal(v, []float64{0.5, 0.8}) {
		t.Errorf("floatList = %v, %v", v, err)
	}
	if v, err := floatList("-x", ""); err != nil || len(v) != 0 {
		t.Errorf("floatList(\"\") = %v, %v", v, err)
	}
	if _, err := floatList("-x", "-1"); err == nil {
		t.Error("floatList accepted -1")
	}
}

func TestWarmMax(t *testing.T) {
	c := &config{load: loadConfig{batches: []int{1, 16, 200}}, memory: memoryConfig{batch: 16}}
	if got := c.warmMax(); got != 256 {
		t.Errorf("warmMax = %d, want 256", got)
	}
	c.load.batches = []int{1}
	if got := c.warmMax(); got != 128 { // parity sends 128
		t.Errorf("warmMax = %d, want 128", got)
	}
}

func TestParseArm(t *testing.T) {
	s, err := parseArm("recmesh-model")
	if err != nil || !s.mesh || s.mode != "model" || s.transport != "grpc" {
		t.Errorf("parseArm(recmesh-model) = %+v, %v", s, err)
	}
	if s, err := parseArm("recmesh-slo-lean"); err != nil || !s.mesh || s.mode != "slo" || s.transport != "lean" {
		t.Errorf("parseArm(recmesh-slo-lean) = %+v, %v", s, err)
	}
	if _, err := parseArm("recmesh-bogus-lean"); err == nil {
		t.Error("parseArm accepted recmesh-bogus-lean")
	}
	if s, err := parseArm("py-mp"); err != nil || s.py != "py-mp" || !s.multi() {
		t.Errorf("parseArm(py-mp) = %+v, %v", s, err)
	}
	if s, err := parseArm("py-batch"); err != nil || s.py != "py-batch" || s.multi() {
		t.Errorf("parseArm(py-batch) = %+v, %v", s, err)
	}
	if s, err := parseArm("py-mp-batch"); err != nil || !s.multi() {
		t.Errorf("parseArm(py-mp-batch) = %+v, %v", s, err)
	}
	if _, err := parseArm("recmesh-bogus"); err == nil {
		t.Error("parseArm accepted recmesh-bogus")
	}
	if _, err := parseArm("xse"); err == nil {
		t.Error("parseArm accepted xse")
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-arms", "nope", "-client-cpus", "", "-server-cpus", ""},
		{"-batches", "x", "-client-cpus", "", "-server-cpus", ""},
		{"-memory-arms", "py", "-client-cpus", "", "-server-cpus", ""},
		{"-repeats", "0", "-client-cpus", "", "-server-cpus", ""},
		{"-stall-cpus", "zero", "-client-cpus", "", "-server-cpus", ""},
		{"-stall-cpus", "4096", "-client-cpus", "", "-server-cpus", ""},
		{"-server-sched", "fifo", "-client-cpus", "", "-server-cpus", ""},
		{"-frontends", "-1", "-client-cpus", "", "-server-cpus", ""},
		{"-py-processes", "-2", "-client-cpus", "", "-server-cpus", ""},
	} {
		err := Run(context.Background(), args, io.Discard, io.Discard, nil)
		if err == nil || strings.Contains(err.Error(), "model config") {
			t.Errorf("run(%q) = %v, want a flag error", args, err)
		}
	}
}

// TestPinPrefixSchedulingPolicy checks that -server-sched batch puts the
// Python arms under chrt (the mesh sets its own policy) and other does not.
func TestPinPrefixSchedulingPolicy(t *testing.T) {
	if _, err := exec.LookPath("chrt"); err != nil {
		t.Skip("no chrt here")
	}
	for _, tc := range []struct {
		sched  string
		python bool
		chrt   bool
	}{
		{"batch", true, true},
		{"batch", false, false},
		{"other", true, false},
	} {
		c := &config{server: serverConfig{sched: tc.sched}}
		prefix, err := c.pinPrefix(tc.python)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Contains(strings.Join(prefix, " "), "chrt --batch 0")
		if got != tc.chrt {
			t.Errorf("-server-sched %s, python %v: prefix %q", tc.sched, tc.python, prefix)
		}
	}
}

func TestParseWorkloads(t *testing.T) {
	ws, err := parseWorkloads("mlperf=data/a, hostbound=/b", "", "")
	if err != nil || len(ws) != 2 || ws[0].name != "mlperf" || !strings.HasSuffix(ws[0].bundle, "/data/a") || ws[1].bundle != "/b" {
		t.Errorf("parseWorkloads = %+v, %v", ws, err)
	}
	for _, bad := range []string{"mlperf", "=x", "a/b=x", "m=a,m=b"} {
		if _, err := parseWorkloads(bad, "", ""); err == nil || !strings.Contains(err.Error(), "-workloads") {
			t.Errorf("parseWorkloads(%q) = %v, want an error naming -workloads", bad, err)
		}
	}
	if ws, err := parseWorkloads("", "/x", "hostbound"); err != nil || len(ws) != 1 || ws[0] != (workload{"hostbound", "/x"}) {
		t.Errorf("single -bundle workload = %+v, %v", ws, err)
	}
}

func TestParseModelLines(t *testing.T) {
	out := []byte("model: cpu=\"x\" cores=1\nmodel: bucket=1 examples_per_s=250 examples_per_core_s=250\n" +
		"noise\nmodel: bucket=128 examples_per_s=3100.5 examples_per_core_s=3000\n")
	got, err := parseModelLines(out)
	if err != nil || len(got) != 2 || got[1] != 250 || got[128] != 3100.5 {
		t.Errorf("parseModelLines = %v, %v", got, err)
	}
	if _, err := parseModelLines([]byte("model: bucket=x examples_per_s=1\n")); err == nil {
		t.Error("a bad bucket parsed")
	}
}

func TestStrictCheck(t *testing.T) {
	ok := &report.Parity{Pass: true}
	runs := []*report.Run{{Workload: "w", Arms: []report.Arm{{Name: "py", Parity: ok}}}}
	if err := strictCheck(runs); err != nil {
		t.Errorf("clean run: %v", err)
	}
	runs[0].Arms = append(runs[0].Arms, report.Arm{Name: "py-batch", Error: "arm py-batch: exited before ready\nlog"},
		report.Arm{Name: "recmesh-full", Parity: &report.Parity{Pass: false}})
	p := &loadgen.Point{Arm: "py", BatchSize: 16, Label: report.LabelClosed, Concurrency: 4, Runs: []loadgen.RunRecord{
		{Result: &loadgen.Result{Errors: 5, ErrorsByCode: map[string]int64{"UNAVAILABLE": 3, "RESOURCE_EXHAUSTED": 2}}}}}
	// Shedding alone is no failure.
	shed := &loadgen.Point{Arm: "recmesh-slo", BatchSize: 16, Label: report.LabelClosed, Concurrency: 64, Runs: []loadgen.RunRecord{
		{Result: &loadgen.Result{Errors: 9, ErrorsByCode: map[string]int64{"RESOURCE_EXHAUSTED": 9}}}}}
	runs[0].Points = append(runs[0].Points, p, shed)
	err := strictCheck(runs)
	if err == nil {
		t.Fatal("a failed arm, a parity failure and request errors passed -strict")
	}
	if strings.Contains(err.Error(), "recmesh-slo") {
		t.Errorf("-strict failed a point that only shed load: %v", err)
	}
	for _, want := range []string{"w/py-batch: arm py-batch: exited before ready", "w/recmesh-full: no parity pass", "w/py B_req 16 closed C=4: 3 failed requests"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("strict error lacks %q:\n%v", want, err)
		}
	}
}

// TestPointSetsAsideStalledRepeats: a repeat whose probe saw a stall past
// -stall-remeasure is kept aside and measured again, at most maxRemeasures
// times, and the last measurement counts. Any real wake-up is a little
// late, so a threshold of a nanosecond sets every window aside.
func TestPointSetsAsideStalledRepeats(t *testing.T) {
	ctx := context.Background()
	srv, pool, w, cpu := pointFixture(t, 1)
	var out strings.Builder
	c := &config{out: &out, stalls: stallConfig{cpus: []int{cpu}, remeasure: time.Nanosecond}}
	rc := loadgen.Config{Mode: loadgen.Closed, Concurrency: 1, Warmup: 20 * time.Millisecond, Duration: 100 * time.Millisecond, Timeout: 5 * time.Second}
	p, err := c.point(ctx, "test-arm", report.LabelClosed, &server{addr: srv.Addr, pid: os.Getpid()}, pool, w, rc, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Runs) != 1 || len(p.SetAside) != maxRemeasures {
		t.Fatalf("%d runs kept and %d set aside, want 1 and %d", len(p.Runs), len(p.SetAside), maxRemeasures)
	}
	if n := strings.Count(out.String(), "repeat 1 set aside, host stall "); n != maxRemeasures {
		t.Errorf("output names %d set-aside repeats, want %d:\n%s", n, maxRemeasures, out.String())
	}

	// Off: nothing is set aside, whatever the stalls.
	out.Reset()
	c.stalls.remeasure = 0
	if p, err = c.point(ctx, "test-arm", report.LabelClosed, &server{addr: srv.Addr, pid: os.Getpid()}, pool, w, rc, 1); err != nil {
		t.Fatal(err)
	}
	if len(p.Runs) != 1 || len(p.SetAside) != 0 || strings.Contains(out.String(), "set aside") {
		t.Errorf("with -stall-remeasure 0: %d runs, %d set aside, output %q", len(p.Runs), len(p.SetAside), out.String())
	}
}

// TestPerCPU: a process count of 0 is one per server CPU; others stand.
func TestPerCPU(t *testing.T) {
	for _, tc := range []struct {
		n    int
		cpus string
		want int
	}{{0, "0", 1}, {0, "0-3", 4}, {0, "1,5", 2}, {2, "0", 2}, {1, "0-7", 1}} {
		set, err := cpuset.Parse(tc.cpus)
		if err != nil {
			t.Fatal(err)
		}
		if got := perCPU(tc.n, set); got != tc.want {
			t.Errorf("perCPU(%d, %s) = %d, want %d", tc.n, tc.cpus, got, tc.want)
		}
	}
}

func TestDetailCounts(t *testing.T) {
	c := &config{server: serverConfig{frontends: 1, pyProcesses: 2, pyWorkers: 8}}
	mesh, err := parseArm("recmesh-slo")
	if err != nil {
		t.Fatal(err)
	}
	py, err := parseArm("py-mp")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec armSpec
		n    int
		want string
	}{
		{mesh, 0, "recmesh run --batch-mode slo, 1 frontend (--transport grpc)"},
		{mesh, 4, "recmesh run --batch-mode slo, 4 frontends (--transport grpc)"},
		{py, 0, "server.py --mode py-mp, 2 frontend processes × 8 gRPC threads"},
		{py, 1, "server.py --mode py-mp, 1 frontend process × 8 gRPC threads"},
	} {
		if got := c.detail(tc.spec, tc.n); got != tc.want {
			t.Errorf("detail(%s, %d) = %q, want %q", tc.spec.name, tc.n, got, tc.want)
		}
	}
}

// summaryPoint is a summarised point of one repeat.
func summaryPoint(arm, label string, b, c int, examplesPerS, p99Ms float64) *loadgen.Point {
	p := &loadgen.Point{Schema: loadgen.PointSchema, Arm: arm, Label: label, Mode: loadgen.Closed, BatchSize: b, Concurrency: c}
	res := &loadgen.Result{ExamplesPerS: examplesPerS, RequestsPerS: examplesPerS / float64(b), Latency: loadgen.LatencySummary{P50: p99Ms / 2, P99: p99Ms}}
	p.Runs = []loadgen.RunRecord{{Repeat: 1, Result: res}}
	p.Summarize()
	return p
}

// TestSuiteLinesDtype: the summary lines are report.SuiteLines, in its
// order, each ending with dtype=<d> of its own workload's tables: from the
// run's note, else its bundle's config.json, else fp32.
func TestSuiteLinesDtype(t *testing.T) {
	int4Bundle := t.TempDir()
	cfg := model.DLRMv2(model.DevVocabCap)
	cfg.TableDtype = model.DtypeInt4
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(int4Bundle, model.ConfigFile), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	int8 := model.DLRMv2(model.DevVocabCap)
	int8.TableDtype = model.DtypeInt8
	fp16Dense := model.DLRMv2(model.DevVocabCap)
	fp16Dense.DenseDtype = model.DenseFP16
	run := func(workload string, env report.Env, memory bool) *report.Run {
		r := &report.Run{Workload: workload, Env: env, Sweep: report.Sweep{Batches: []int{1, 16}, BudgetFractions: []float64{0.8}}}
		for _, arm := range []string{"recmesh-slo", "py-mp-batch"} {
			r.Arms = append(r.Arms, report.Arm{Name: arm, Kind: report.KindOf(arm)})
			for _, b := range []int{1, 16} {
				r.Points = append(r.Points, summaryPoint(arm, report.LabelClosed, b, 4, float64(100*b), 5),
					summaryPoint(arm, report.BudgetLabel(0.8), b, 0, float64(80*b), 4))
			}
		}
		if memory {
			r.Memory = &report.MemoryCheck{TableBytes: int8.TableBytes(), Rows: []report.MemoryRow{
				{Arm: "recmesh-slo", Kind: report.KindRecmesh, Instances: 2, PSSBytes: 300 << 20},
				{Arm: "py-mp-batch", Kind: report.KindPython, Instances: 2, PSSBytes: 600 << 20}}}
		}
		return r
	}
	runs := []*report.Run{
		run("mlperf", report.Env{Notes: []string{dtypeNote(int8), "another note", denseNote(fp16Dense)}}, false),
		run("hostbound", report.Env{Bundle: int4Bundle}, true),
		run("old", report.Env{Bundle: filepath.Join(t.TempDir(), "gone")}, true),
	}
	want := map[string]string{"mlperf": "int8", "hostbound": "int4", "old": "fp32"}
	wantDense := map[string]string{"mlperf": "fp16", "hostbound": "fp32", "old": "fp32"}
	got := suiteLines(runs)
	plain := report.SuiteLines(runs)
	if len(got) != len(plain) || len(got) == 0 {
		t.Fatalf("%d lines, report.SuiteLines gives %d:\n%s", len(got), len(plain), strings.Join(got, "\n"))
	}
	kinds := map[string]bool{}
	for i, l := range got {
		rest, ds, ok := strings.Cut(l, " dtype=")
		d, dd, ok2 := strings.Cut(ds, " dense_dtype=")
		if !ok || !ok2 || rest != plain[i] || strings.Contains(d, " ") || strings.Contains(dd, " ") {
			t.Errorf("line %d is %q, want %q followed by dtype=<d> dense_dtype=<d>", i, l, plain[i])
			continue
		}
		kind, _, _ := strings.Cut(l, " ")
		kinds[kind] = true
		w := "hostbound" // the bench-memory: line: the first workload with a memory check
		if _, f, ok := strings.Cut(l, "workload="); ok {
			w, _, _ = strings.Cut(f, " ")
		}
		if d != want[w] || dd != wantDense[w] {
			t.Errorf("line %q: dtype %s dense_dtype %s, want %s and %s (workload %s)", l, d, dd, want[w], wantDense[w], w)
		}
	}
	for _, k := range []string{"bench:", "bench-ratio:", "bench-open:", "bench-memory:"} {
		if !kinds[k] {
			t.Errorf("no %s line among\n%s", k, strings.Join(got, "\n"))
		}
	}
	if n := denseNote(fp16Dense); !strings.HasPrefix(n, "Dense weights: fp16 (config.json dense_dtype), ") || !strings.Contains(n, "halves") {
		t.Errorf("fp16 dense note %q", n)
	}
	if n := dtypeNote(int8); !strings.HasPrefix(n, "Embedding tables: int8 (config.json table_dtype), 2.4 MiB: ") || !strings.Contains(n, "dequantizing") {
		t.Errorf("int8 note %q", n)
	}
	if n := dtypeNote(model.DLRMv2(model.DevVocabCap)); !strings.HasPrefix(n, "Embedding tables: fp32 (config.json table_dtype), 9.0 MiB: ") || strings.Contains(n, "dequantizing") {
		t.Errorf("fp32 note %q", n)
	}
}
