package benchrun

import (
	"fmt"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/model"
)

// TestCheckFits: a Python arm is refused exactly when its private table
// copies (one per gathering process) and its processes' overhead exceed
// what is available, and the refusal says so in numbers.
func TestCheckFits(t *testing.T) {
	const table = 13 << 30
	avail := int64(22 << 30)
	for _, tc := range []struct {
		arm  string
		n    int
		fits bool
	}{
		{"py", 4, true}, // one process, one copy, whatever n
		{"py-batch", 4, true},
		{"py-mp", 1, true},
		{"py-mp", 2, false},
		{"py-mp-batch", 4, false},
		{"py-mp-local", 2, false},
	} {
		spec, err := parseArm(tc.arm)
		if err != nil {
			t.Fatal(err)
		}
		err = checkFits(spec, tc.n, table, avail)
		if (err == nil) != tc.fits {
			t.Errorf("%s × %d: fits %v, got %v", tc.arm, tc.n, tc.fits, err)
			continue
		}
		if err != nil && (!strings.HasPrefix(err.Error(), errDoesNotFit) || !strings.Contains(err.Error(), "MemAvailable is 22.0 GiB")) {
			t.Errorf("%s × %d: %v", tc.arm, tc.n, err)
		}
	}
	// The boundary: the overhead counts too.
	py, _ := parseArm("py")
	if err := checkFits(py, 1, table, table+pyProcessOverhead); err != nil {
		t.Errorf("exactly enough: %v", err)
	}
	if err := checkFits(py, 1, table, table+pyProcessOverhead-1); err == nil {
		t.Error("one byte short: started")
	}
}

// TestFullSizeLine: the line carries the mesh's best point within the
// budget per B_req, its largest PSS, its parity, and the best Python arm
// at B_req 16, or did-not-fit when every Python arm was refused for memory.
func TestFullSizeLine(t *testing.T) {
	cfg := model.DLRMv2(model.DevVocabCap)
	cfg.TableDtype = model.DtypeInt4
	withPSS := func(p *loadgen.Point, pss int64) *loadgen.Point {
		p.Summary.ServerPeakPSSBytes = pss
		return p
	}
	r := &report.Run{Workload: "hostbound"}
	r.Arms = []report.Arm{
		{Name: "recmesh-slo", Kind: report.KindRecmesh, Parity: &report.Parity{Pass: true, MaxAbsDiff: 2.5e-7}},
		{Name: "py", Kind: report.KindPython, Error: "arm py: " + errDoesNotFit + ": 1 private table copies"},
		{Name: "py-mp", Kind: report.KindPython, Error: "arm py-mp: " + errDoesNotFit + ": 2 private table copies"},
	}
	r.Points = []*loadgen.Point{
		withPSS(summaryPoint("recmesh-slo", report.LabelClosed, 1, 1, 900, 3), 5<<30),
		withPSS(summaryPoint("recmesh-slo", report.LabelClosed, 1, 16, 1500, 25), 6<<30), // over budget
		withPSS(summaryPoint("recmesh-slo", report.LabelClosed, 16, 4, 4000, 12), 7<<30),
		withPSS(summaryPoint("recmesh-slo", report.LabelClosed, 128, 4, 6000, 30), 8<<30), // over budget
	}
	var rows int64
	for _, v := range cfg.VocabSizes {
		rows += int64(v)
	}
	got := fullSizeLine(r, cfg)
	want := fmt.Sprintf("full-size: dtype=int4 rows=%d table_gib=0.00 mesh_pss_gib=8.00 parity_max_abs_diff=2.5e-07 b1=900 b16=4000 b128=0 python=did-not-fit", rows)
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}

	// A Python arm that ran: its best at B_req 16.
	r.Arms = append(r.Arms, report.Arm{Name: "py-batch", Kind: report.KindPython})
	r.Points = append(r.Points, summaryPoint("py-batch", report.LabelClosed, 16, 4, 700, 15), summaryPoint("py-batch", report.LabelClosed, 16, 16, 800, 19))
	if got := fullSizeLine(r, cfg); !strings.HasSuffix(got, " python=800") {
		t.Errorf("with py-batch measured: %s", got)
	}
	// One that failed for another reason is not did-not-fit.
	r.Arms[3].Error, r.Points = "arm py-batch: parity failed", r.Points[:4]
	if got := fullSizeLine(r, cfg); !strings.HasSuffix(got, " python=0") {
		t.Errorf("with py-batch broken: %s", got)
	}
}
