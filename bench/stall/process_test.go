package stall

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// TestProcessReports: a probe in a process of its own, once set up,
// watches its CPU from Begin to Stop and hands back its report.
func TestProcessReports(t *testing.T) {
	cpu := allowedCPUs(t)[0]
	p, err := StartProcess(cpu, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Set-up is done before StartProcess returns: the window is Begin to
	// Stop, whatever the process's start-up cost.
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	const window = 300 * time.Millisecond
	time.Sleep(window)
	r, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", r)
	// The window starts at Begin's instant, however late the probe reads
	// it, and ends when the probe sees stdin close; its wake-ups and their
	// delays account for all of it.
	if r.CPU != cpu || r.WallS < window.Seconds() || r.WallS > 5 || r.Wakeups < 1 || r.PeriodMs != 1 {
		t.Fatalf("report %+v, want CPU %d, about 0.3 s of 1 ms wake-ups", r, cpu)
	}
	checkCovers(t, r)
	if r.Memory != nil {
		t.Fatalf("memory report %+v from a probe started without one", r.Memory)
	}
	if c := r.Compute; c == nil || int64(c.Samples) != r.Wakeups/computeEvery || !(c.NsP50 > 0) || c.NsP90 < c.NsP50 || c.NsMax < c.NsP90 {
		t.Fatalf("compute report %+v, want one sample every %d of %d wake-ups, ordered", c, computeEvery, r.Wakeups)
	}
}

// TestProcessStoppedBeforeBegin: a probe stopped before its window began
// reports nothing seen.
func TestProcessStoppedBeforeBegin(t *testing.T) {
	p, err := StartProcess(allowedCPUs(t)[0], 2)
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if r.Wakeups != 0 || r.WallS != 0 || r.Memory == nil || r.Memory.Bursts != 0 {
		t.Fatalf("report %+v (memory %+v), want nothing seen", r, r.Memory)
	}
}

// TestProbeReadsBeginLate: a probe process kept off its CPUs for the
// whole window reads the begin line and the end of its input at once
// (what a loaded CI machine did). The window happened all the same: it
// reports the time since Begin's instant as its first wake-up's delay,
// and its memory probe one burst, instead of an empty report.
func TestProbeReadsBeginLate(t *testing.T) {
	const starved = 400 * time.Millisecond
	in := strings.NewReader(fmt.Sprintf(beginLine, time.Now().Add(-starved).UnixNano()))
	var out bytes.Buffer
	if err := Command("prog", []string{"-cpu", fmt.Sprint(allowedCPUs(t)[0]), "-memory-mib", "2"}, in, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	_, report, _ := strings.Cut(out.String(), readyLine)
	var r Report
	if err := json.Unmarshal([]byte(report), &r); err != nil {
		t.Fatalf("report %q: %v", out.String(), err)
	}
	t.Logf("%s", &r)
	if r.Wakeups < 1 || r.WallS < starved.Seconds() || r.MaxDelayMs < 0.99*float64(starved.Milliseconds()) || r.LateOver10ms < 1 {
		t.Fatalf("report %+v, want the %v before the probe ran counted as a late wake-up", r, starved)
	}
	checkCovers(t, &r)
	if r.Memory == nil || r.Memory.Bursts < 1 {
		t.Fatalf("memory report %+v, want at least one burst", r.Memory)
	}
}

// TestProcessFailure: a probe that cannot pin itself fails to start, and
// the error says which probe.
func TestProcessFailure(t *testing.T) {
	p, err := StartProcess(1<<20, 0)
	if err == nil || p != nil || !strings.Contains(err.Error(), "-cpu 1048576") {
		t.Fatalf("StartProcess = %v, %v, want an error naming the probe", p, err)
	}
}

func TestCommandFlags(t *testing.T) {
	for _, args := range [][]string{{}, {"-cpu", "x"}, {"-cpu", "0", "extra"}, {"-cpu", "0", "-memory-mib", "-1"}} {
		var out bytes.Buffer
		if err := Command("prog", args, strings.NewReader(""), &out, io.Discard); err == nil {
			t.Errorf("Command(%q) = nil, want an error", args)
		}
		if out.Len() != 0 {
			t.Errorf("Command(%q) wrote a report: %q", args, out.String())
		}
	}
}

func TestSummary(t *testing.T) {
	if got := Summary(nil); got != "" {
		t.Errorf("Summary(nil) = %q, want empty", got)
	}
	got := Summary([]*Report{
		{CPU: 0, MaxDelayMs: 3.25, StealPct: 4.5},
		nil,
		{CPU: 1, MaxDelayMs: 12.5, StealPct: 0.5},
	})
	if want := ", host stall max 12.5 ms (CPU 1), steal max 4.5 %"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
	if w := Worst([]*Report{nil, {CPU: 3, MaxDelayMs: 1}, {CPU: 2, MaxDelayMs: 7}}); w == nil || w.CPU != 2 {
		t.Errorf("Worst = %+v, want CPU 2's report", w)
	}
	if w := Worst([]*Report{nil}); w != nil {
		t.Errorf("Worst of no reports = %+v, want nil", w)
	}
}

// TestProbesStopOnce: a set of probes reports once per CPU, in order, the
// last with the memory probe, and a second Stop (a deferred clean-up)
// finds nothing left.
func TestProbesStopOnce(t *testing.T) {
	cpus := allowedCPUs(t)
	want := []int{cpus[0], cpus[len(cpus)-1]}
	ps, err := StartProbes(want, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Begin(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	rs, err := ps.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].CPU != want[0] || rs[1].CPU != want[1] {
		t.Fatalf("reports %+v, want one for each of CPUs %v in order", rs, want)
	}
	if rs[0].Memory != nil {
		t.Errorf("the first CPU's probe ran the memory probe: %+v", rs[0].Memory)
	}
	if m := rs[1].Memory; m == nil || m.BufferMiB != 4 || m.Bursts < 1 || !(m.LoadNsP50 > 0) || m.LoadNsMax < m.LoadNsP90 || m.LoadNsP90 < m.LoadNsP50 {
		t.Errorf("the last CPU's memory report: %+v, want bursts over 4 MiB with ordered latencies", m)
	}
	if rs, err := ps.Stop(); rs != nil || err != nil {
		t.Fatalf("second Stop = %v, %v, want nothing", rs, err)
	}
	var none *Probes
	if err := none.Begin(); err != nil {
		t.Fatalf("Begin on nil = %v", err)
	}
	if rs, err := none.Stop(); rs != nil || err != nil {
		t.Fatalf("Stop on nil = %v, %v, want nothing", rs, err)
	}
}

func TestParseCPUs(t *testing.T) {
	if cpus, err := ParseCPUs(""); cpus != nil || err != nil {
		t.Errorf("ParseCPUs(\"\") = %v, %v, want none", cpus, err)
	}
	if cpus, err := ParseCPUs("0"); err != nil || len(cpus) != 1 || cpus[0] != 0 {
		t.Errorf("ParseCPUs(\"0\") = %v, %v", cpus, err)
	}
	for _, bad := range []string{"zero", "4096"} {
		if _, err := ParseCPUs(bad); err == nil || !strings.Contains(err.Error(), "-stall-cpus") {
			t.Errorf("ParseCPUs(%q) = %v, want an error naming -stall-cpus", bad, err)
		}
	}
}
