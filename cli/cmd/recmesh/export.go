package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/recmesh/recmesh/cli/internal/progress"
	"github.com/recmesh/recmesh/model"
)

// Defaults of recmesh export: the small bundle that make run and the tests
// use.
const (
	defaultExportMaxVocab = model.DevVocabCap
	defaultExportSeed     = 1
	defaultExportOut      = model.DefaultDevBundle
	defaultExportPreset   = model.PresetMLPerf
	// defaultExportDtype is the published benchmark's table precision.
	defaultExportDtype = model.DtypeFP32
	// defaultExportDenseDtype is the published benchmark's dense precision.
	defaultExportDenseDtype = model.DenseFP32
)

func init() {
	register(&command{
		name:    "export",
		summary: "write a seeded DLRM-DCNv2 weights bundle",
		run:     runExport,
	})
}

// The flags that override a preset's dense network, by the config.json
// field each sets (so a Validate refusal can name the flag).
var shapeFlags = map[string]string{
	"bottom_mlp":   "bottom-mlp",
	"top_mlp":      "top-mlp",
	"cross_layers": "cross-layers",
	"cross_rank":   "cross-rank",
}

func runExport(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	maxVocab := fs.Int("max-vocab", defaultExportMaxVocab,
		"cap on every embedding table's `rows`; 0 means uncapped (about 104 GB)")
	seed := fs.Uint64("seed", defaultExportSeed, "`seed` the weights are drawn from")
	out := fs.String("out", defaultExportOut, "bundle `directory` to write (replaced if it holds a bundle)")
	preset := fs.String("preset", defaultExportPreset,
		"dense network to start from: `name` mlperf (the MLPerf DLRMv2 model) or hostbound\n"+
			"(the same tables and ids, the smallest dense network: bottom 128, no cross layers, top 1)")
	tableDtype := fs.String("table-dtype", string(defaultExportDtype),
		"`precision` of the embedding tables: fp32, fp16 (IEEE half), int8 or int4 (row-wise scale and bias,\n"+
			"as FBGEMM quantizes; row layouts in docs/design.md); every precision of one seed is the same model")
	denseDtype := fs.String("dense-dtype", string(defaultExportDenseDtype),
		"`precision` of the dense weights and biases: fp32, fp16 (IEEE half) or bf16 (bfloat16), each weight\n"+
			"the float32 one rounded to nearest even; any table precision combines with any dense one")
	var bottom, top widthsFlag
	var layers, rank optionalInt
	fs.Var(&bottom, "bottom-mlp", "bottom MLP output `widths`, comma-separated, the last 128 (default: the preset's)")
	fs.Var(&top, "top-mlp", "top MLP output `widths`, comma-separated, the last 1 (default: the preset's)")
	fs.Var(&layers, "cross-layers", "`number` of DCNv2 cross layers, 0 or more (default: the preset's)")
	fs.Var(&rank, "cross-rank", "`rank` of each cross layer (default: the preset's; unused with 0 cross layers)")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *maxVocab < 0 {
		return usagef("-max-vocab is %d; want 0 (uncapped) or more", *maxVocab)
	}
	if *out == "" {
		return usagef("-out is empty; want a directory")
	}

	dtype, err := model.ParseDtype(*tableDtype)
	if err != nil {
		return usagef("-table-dtype: %v", err)
	}
	dense, err := model.ParseDenseDtype(*denseDtype)
	if err != nil {
		return usagef("-dense-dtype: %v", err)
	}

	cfg, err := model.Preset(*preset, *maxVocab)
	if err != nil {
		return usagef("-preset %q: want %s", *preset, strings.Join(model.PresetNames(), " or "))
	}
	cfg.TableDtype, cfg.DenseDtype = dtype, dense
	base := cfg
	if bottom.set {
		cfg.BottomMLP = bottom.widths
	}
	if top.set {
		cfg.TopMLP = top.widths
	}
	if layers.set {
		cfg.CrossLayers = layers.n
		if layers.n == 0 && !rank.set {
			cfg.CrossRank = 0 // unused: keep config.json from suggesting otherwise
		}
	}
	if rank.set {
		cfg.CrossRank = rank.n
	}
	if !slices.Equal(cfg.BottomMLP, base.BottomMLP) || !slices.Equal(cfg.TopMLP, base.TopMLP) ||
		cfg.CrossLayers != base.CrossLayers || cfg.CrossRank != base.CrossRank {
		cfg.Name += "-custom"
	}
	if err := cfg.Validate(); err != nil {
		var fe *model.FieldError
		if errors.As(err, &fe) {
			if name, ok := shapeFlags[fe.Field]; ok {
				v := fs.Lookup(name).Value.String()
				if v == "" {
					v = "(the -preset " + *preset + " default)"
				}
				return usagef("-%s %s: %v", name, v, err)
			}
			if fe.Field == model.FieldDense {
				return usagef("-bottom-mlp, -top-mlp, -cross-layers, -cross-rank: %v", err)
			}
		}
		return usagef("%v", err)
	}

	var bar *progress.Bar
	if e.isTerminal(e.stderr) {
		bar = progress.New(e.stderr, "export")
	}
	var written int64
	start := time.Now()
	// Off a terminal (a log, CI, a pipe) progress is a line every
	// exportReportEvery, so an export of the full tables (minutes) does
	// not look hung and a small one prints only its summary.
	lastReport := start
	err = model.Export(ctx, *out, cfg, *seed, func(done, total int64) {
		written = total
		if bar != nil {
			bar.Update(done, total)
			return
		}
		if now := time.Now(); total > 0 && done < total && now.Sub(lastReport) >= exportReportEvery {
			lastReport = now
			fmt.Fprintf(e.stderr, "export: %d%% (%.1f of %.1f GB, %.0fs)\n",
				done*100/total, float64(done)/1e9, float64(total)/1e9, now.Sub(start).Seconds())
		}
	})
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "export: wrote %s (model=%s, table_dtype=%s, dense_dtype=%s, rows=%d, bytes=%d, %.1fs)\n",
		*out, cfg.Name, cfg.TableDtype, cfg.DenseDtype, cfg.TotalRows(), written, time.Since(start).Seconds())
	return nil
}

// exportReportEvery is how often an export off a terminal says how far it is.
const exportReportEvery = 10 * time.Second

// widthsFlag is a comma-separated list of layer widths, each a positive
// integer; whether the list ends where the model needs it to is left to
// model.Config.Validate.
type widthsFlag struct {
	widths []int
	set    bool
}

func (w *widthsFlag) String() string {
	if w == nil || !w.set {
		return ""
	}
	s := make([]string, len(w.widths))
	for i, v := range w.widths {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (w *widthsFlag) Set(v string) error {
	parts := strings.Split(v, ",")
	widths := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return fmt.Errorf("width %d is %q; want a positive integer (as in 512,256,128)", i, p)
		}
		widths[i] = n
	}
	w.widths, w.set = widths, true
	return nil
}

// optionalInt is an integer flag that remembers whether it was given, so
// an absent one leaves the preset's value.
type optionalInt struct {
	n   int
	set bool
}

func (o *optionalInt) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.Itoa(o.n)
}

func (o *optionalInt) Set(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%q is not an integer", v)
	}
	if n < 0 {
		return fmt.Errorf("%d is negative", n)
	}
	o.n, o.set = n, true
	return nil
}
