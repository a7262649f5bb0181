package accuracy

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/recmesh/recmesh/model"
)

// MLPerf's accuracy targets, as a fraction of the float32 model's AUC.
const (
	// TargetHigh is the 99.9 % target, which fp16 and int8 tables and
	// fp16 and bf16 dense weights must meet, alone and together.
	TargetHigh = 0.999
	// TargetLow is the 99 % target, which int4 tables must meet, whatever
	// the dense weights' precision.
	TargetLow = 0.99
)

// Target returns the auc_ratio a model with tables at d and dense weights
// at dd must reach: float32's own AUC at fp32 and fp32, MLPerf's 99 % with
// int4 tables, whose rounding dominates any dense precision's, and 99.9 %
// otherwise.
func Target(d model.Dtype, dd model.DenseDtype) float64 {
	switch {
	case d.String() == string(model.DtypeInt4):
		return TargetLow
	case d.String() == string(model.DtypeFP32) && dd.String() == string(model.DenseFP32):
		return 1
	}
	return TargetHigh
}

// The calibration's goal: Criteo's AUC for DLRMv2 (MLPerf's quality
// target is 0.8025 on the Criteo 1TB click logs).
const (
	CalibrationAUC       = 0.80
	CalibrationTolerance = 0.01
)

// Options is one accuracy run.
type Options struct {
	// Preset and MaxVocab shape the model (model.Preset), and Seed draws
	// its weights, as recmesh export would; no bundle is read.
	Preset   string
	MaxVocab int
	Seed     uint64
	// InputSeed and Examples are the draw of examples (model.RandomInputs,
	// as the benchmark's load generator draws its requests).
	InputSeed uint64
	Examples  int
	// LabelSeed draws the uniforms the labels are drawn with (Uniforms).
	LabelSeed uint64
	// Dtypes are the table precisions and DenseDtypes the dense ones to
	// score, every table precision with every dense one; fp32 is always
	// scored first in both, whether listed or not, since every other line
	// is relative to fp32 tables with fp32 dense weights.
	Dtypes      []model.Dtype
	DenseDtypes []model.DenseDtype
	// TableMemory bounds the bytes of tables held in memory at once
	// (model.NewGeneratedReference); the rest are regenerated per read.
	TableMemory int64
	// Log, if not nil, gets a line per step with its time.
	Log io.Writer
}

// Line is one combination's result (tables at Dtype, dense weights at
// DenseDtype), printed as an MLPerf-style accuracy line.
type Line struct {
	Dtype      model.Dtype
	DenseDtype model.DenseDtype
	Examples   int
	AUC        float64
	FP32AUC    float64
	// MaxAbsDiff and MeanAbsDiff are of the scores against those of fp32
	// tables with fp32 dense weights.
	MaxAbsDiff, MeanAbsDiff float64
}

// Ratio is AUC over float32's AUC.
func (l Line) Ratio() float64 { return l.AUC / l.FP32AUC }

// Target is the auc_ratio the line's combination must reach.
func (l Line) Target() float64 { return Target(l.Dtype, l.DenseDtype) }

// Pass reports whether the combination meets its target.
func (l Line) Pass() bool { return l.Ratio() >= l.Target() }

func (l Line) String() string {
	return fmt.Sprintf("accuracy: dtype=%s dense_dtype=%s examples=%d auc=%.6f fp32_auc=%.6f auc_ratio=%.6f max_abs_diff=%.3e mean_abs_diff=%.3e",
		l.Dtype, l.DenseDtype, l.Examples, l.AUC, l.FP32AUC, l.Ratio(), l.MaxAbsDiff, l.MeanAbsDiff)
}

// Result is a whole run.
type Result struct {
	Calibration Calibration
	Positives   int
	// Lines are in table precision order, each table precision's dense
	// precisions in order: fp32 tables with fp32 dense weights first.
	Lines []Line
}

// Failures names every combination below its target, with its ratio.
func (r Result) Failures() []string {
	var out []string
	for _, l := range r.Lines {
		if !l.Pass() {
			out = append(out, fmt.Sprintf("dtype=%s dense_dtype=%s auc_ratio=%.6f below %v", l.Dtype, l.DenseDtype, l.Ratio(), l.Target()))
		}
	}
	return out
}

// Run scores the examples with every combination of table and dense
// precision, calibrates labels on the scores of fp32 tables with fp32
// dense weights and computes each combination's line. Each table
// precision's tables are generated once and each example pooled once, then
// run through every dense precision's network: the pooled vectors do not
// depend on the dense weights, and the dense networks are far smaller than
// the tables. emit, if not nil, is called with each line as soon as it is
// known (the first once the calibration is).
func Run(ctx context.Context, o Options, emit func(Line)) (Result, error) {
	if o.Examples < 2 {
		return Result{}, fmt.Errorf("accuracy: %d examples; want at least 2", o.Examples)
	}
	dtypes := []model.Dtype{model.DtypeFP32}
	for _, d := range o.Dtypes {
		if d.String() != string(model.DtypeFP32) && !slices.Contains(dtypes, d) {
			dtypes = append(dtypes, d)
		}
	}
	denses := []model.DenseDtype{model.DenseFP32}
	for _, dd := range o.DenseDtypes {
		if dd.String() != string(model.DenseFP32) && !slices.Contains(denses, dd) {
			denses = append(denses, dd)
		}
	}
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, "accuracy: "+format+"\n", args...)
		}
	}
	var res Result
	var fp32 []float32
	var labels []bool
	for _, d := range dtypes {
		start := time.Now()
		refs := make([]*model.Reference, len(denses))
		for i, dd := range denses {
			cfg, err := model.Preset(o.Preset, o.MaxVocab)
			if err != nil {
				return res, err
			}
			cfg.TableDtype, cfg.DenseDtype = d, dd
			// Only the first pools, so only its tables are held.
			mem := o.TableMemory
			if i > 0 {
				mem = 0
			}
			if refs[i], err = model.NewGeneratedReference(cfg, o.Seed, mem); err != nil {
				return res, err
			}
		}
		gen := time.Since(start)
		cfg, err := model.Preset(o.Preset, o.MaxVocab)
		if err != nil {
			return res, err
		}
		scores, err := score(ctx, refs, cfg, o.InputSeed, o.Examples)
		if err != nil {
			return res, err
		}
		refs = nil
		// The next precision's tables take the place of this one's.
		debug.FreeOSMemory()
		logf("%s: %d examples scored at dense %s in %.1fs (weights generated in %.1fs)",
			d, o.Examples, denseList(denses), time.Since(start).Seconds(), gen.Seconds())

		for i, dd := range denses {
			if fp32 == nil {
				fp32 = scores[i]
				c, err := Calibrate(fp32, Uniforms(o.LabelSeed, o.Examples), CalibrationAUC, CalibrationTolerance)
				if err != nil {
					return res, err
				}
				res.Calibration = c
				labels = c.Labels(fp32, Uniforms(o.LabelSeed, o.Examples))
				for _, y := range labels {
					if y {
						res.Positives++
					}
				}
				logf("calibration: k=%.6g c=%.6g positives=%d of %d fp32_auc=%.6f label_seed=%d",
					c.K, c.C, res.Positives, o.Examples, c.AUC, o.LabelSeed)
			}
			auc, err := AUC(scores[i], labels)
			if err != nil {
				return res, err
			}
			l := Line{Dtype: d, DenseDtype: dd, Examples: o.Examples, AUC: auc, FP32AUC: res.Calibration.AUC}
			var sum float64
			for k, s := range scores[i] {
				diff := math.Abs(float64(s) - float64(fp32[k]))
				l.MaxAbsDiff = max(l.MaxAbsDiff, diff)
				sum += diff
			}
			l.MeanAbsDiff = sum / float64(o.Examples)
			res.Lines = append(res.Lines, l)
			if emit != nil {
				emit(l)
			}
		}
	}
	return res, nil
}

func denseList(ds []model.DenseDtype) string {
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = d.String()
	}
	return strings.Join(names, ", ")
}

// scoreBlock is how many examples one goroutine draws, pools and scores
// at a time: 3.5 MB of pooled vectors, so a block's working set stays
// small however many examples are scored.
const scoreBlock = 256

// score returns, for each of refs, its scores of examples 0 … n-1 of the
// draw from seed. The refs must differ in their dense weights only: refs[0]
// pools every example, and every ref's network runs on those pooled
// vectors. Each block's scores depend only on its examples, so the result
// does not depend on the number of goroutines.
func score(ctx context.Context, refs []*model.Reference, cfg model.Config, seed uint64, n int) ([][]float32, error) {
	scores := make([][]float32, len(refs))
	for i := range scores {
		scores[i] = make([]float32, n)
	}
	blocks := (n + scoreBlock - 1) / scoreBlock
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, runtime.GOMAXPROCS(0))
	for w := range errs {
		wg.Go(func() {
			pooled := make([]float32, scoreBlock*len(cfg.VocabSizes)*cfg.EmbeddingDim)
			for {
				b := int(next.Add(1) - 1)
				if b >= blocks || ctx.Err() != nil {
					return
				}
				lo, hi := b*scoreBlock, min((b+1)*scoreBlock, n)
				dense, sparse := model.RandomInputsAt(cfg, seed, lo, hi-lo)
				p := pooled[:len(dense)/cfg.NumDense*len(cfg.VocabSizes)*cfg.EmbeddingDim]
				if err := refs[0].Pool(sparse, hi-lo, p); err != nil {
					errs[w] = err
					return
				}
				for i, ref := range refs {
					if err := ref.Forward(dense, p, hi-lo, scores[i][lo:hi]); err != nil {
						errs[w] = err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return scores, ctx.Err()
}

// ParseDtypes parses a comma-separated list of precisions.
func ParseDtypes(s string) ([]model.Dtype, error) {
	var out []model.Dtype
	for _, name := range strings.Split(s, ",") {
		d, err := model.ParseDtype(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// ParseDenseDtypes parses a comma-separated list of dense precisions.
func ParseDenseDtypes(s string) ([]model.DenseDtype, error) {
	var out []model.DenseDtype
	for _, name := range strings.Split(s, ",") {
		d, err := model.ParseDenseDtype(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}
