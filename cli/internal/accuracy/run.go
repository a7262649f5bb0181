package accuracy

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/recmesh/recmesh/model"
)

// MLPerf's accuracy targets, as a fraction of the float32 model's AUC.
const (
	// TargetHigh is the 99.9 % target, which fp16 and int8 must meet.
	TargetHigh = 0.999
	// TargetLow is the 99 % target, which int4 must meet.
	TargetLow = 0.99
)

// Target returns the auc_ratio precision d must reach.
func Target(d model.Dtype) float64 {
	switch d.String() {
	case string(model.DtypeFP32):
		return 1
	case string(model.DtypeInt4):
		return TargetLow
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
	// Dtypes are the precisions to score; fp32 is always scored first,
	// whether listed or not, since every other line is relative to it.
	Dtypes []model.Dtype
	// TableMemory bounds the bytes of tables held in memory at once
	// (model.NewGeneratedReference); the rest are regenerated per read.
	TableMemory int64
	// Log, if not nil, gets a line per step with its time.
	Log io.Writer
}

// Line is one precision's result, printed as MLPerf-style accuracy line.
type Line struct {
	Dtype    model.Dtype
	Examples int
	AUC      float64
	FP32AUC  float64
	// MaxAbsDiff and MeanAbsDiff are of the scores against float32's.
	MaxAbsDiff, MeanAbsDiff float64
}

// Ratio is AUC over float32's AUC.
func (l Line) Ratio() float64 { return l.AUC / l.FP32AUC }

// Pass reports whether the precision meets its target.
func (l Line) Pass() bool { return l.Ratio() >= Target(l.Dtype) }

func (l Line) String() string {
	return fmt.Sprintf("accuracy: dtype=%s examples=%d auc=%.6f fp32_auc=%.6f auc_ratio=%.6f max_abs_diff=%.3e mean_abs_diff=%.3e",
		l.Dtype, l.Examples, l.AUC, l.FP32AUC, l.Ratio(), l.MaxAbsDiff, l.MeanAbsDiff)
}

// Result is a whole run.
type Result struct {
	Calibration Calibration
	Positives   int
	Lines       []Line // fp32 first
}

// Failures names every precision below its target, with its ratio.
func (r Result) Failures() []string {
	var out []string
	for _, l := range r.Lines {
		if !l.Pass() {
			out = append(out, fmt.Sprintf("%s auc_ratio=%.6f below %v", l.Dtype, l.Ratio(), Target(l.Dtype)))
		}
	}
	return out
}

// Run scores the examples at every precision, calibrates labels on the
// float32 scores and computes each precision's line. emit, if not nil, is
// called with each line as soon as it is known (fp32's once the
// calibration is).
func Run(ctx context.Context, o Options, emit func(Line)) (Result, error) {
	if o.Examples < 2 {
		return Result{}, fmt.Errorf("accuracy: %d examples; want at least 2", o.Examples)
	}
	dtypes := []model.Dtype{model.DtypeFP32}
	for _, d := range o.Dtypes {
		if d.String() != string(model.DtypeFP32) {
			dtypes = append(dtypes, d)
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
		cfg, err := model.Preset(o.Preset, o.MaxVocab)
		if err != nil {
			return res, err
		}
		cfg.TableDtype = d
		start := time.Now()
		ref, err := model.NewGeneratedReference(cfg, o.Seed, o.TableMemory)
		if err != nil {
			return res, err
		}
		gen := time.Since(start)
		scores, err := score(ctx, ref, cfg, o.InputSeed, o.Examples)
		if err != nil {
			return res, err
		}
		ref = nil
		// The next precision's tables take the place of this one's.
		debug.FreeOSMemory()
		logf("%s: %d examples scored in %.1fs (weights generated in %.1fs)", d, o.Examples, time.Since(start).Seconds(), gen.Seconds())

		if fp32 == nil {
			fp32 = scores
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
		auc, err := AUC(scores, labels)
		if err != nil {
			return res, err
		}
		l := Line{Dtype: d, Examples: o.Examples, AUC: auc, FP32AUC: res.Calibration.AUC}
		var sum float64
		for i, s := range scores {
			diff := math.Abs(float64(s) - float64(fp32[i]))
			l.MaxAbsDiff = max(l.MaxAbsDiff, diff)
			sum += diff
		}
		l.MeanAbsDiff = sum / float64(o.Examples)
		res.Lines = append(res.Lines, l)
		if emit != nil {
			emit(l)
		}
	}
	return res, nil
}

// scoreBlock is how many examples one goroutine draws, pools and scores
// at a time: 3.5 MB of pooled vectors, so a block's working set stays
// small however many examples are scored.
const scoreBlock = 256

// score returns ref's scores of examples 0 … n-1 of the draw from seed.
// Each block's scores depend only on its examples, so the result does not
// depend on the number of goroutines.
func score(ctx context.Context, ref *model.Reference, cfg model.Config, seed uint64, n int) ([]float32, error) {
	scores := make([]float32, n)
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
				if err := ref.Pool(sparse, hi-lo, p); err != nil {
					errs[w] = err
					return
				}
				if err := ref.Forward(dense, p, hi-lo, scores[lo:hi]); err != nil {
					errs[w] = err
					return
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
