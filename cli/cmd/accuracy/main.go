// Command accuracy is MLPerf's accuracy rule for the model's precisions
// (make bench-accuracy): it scores the same examples with the model's
// tables at fp32, fp16, int8 and int4, each with its dense weights at
// fp32, fp16 and bf16, draws labels once from the scores of fp32 tables
// with fp32 dense weights (see package cli/internal/accuracy) and prints,
// per combination,
//
//	accuracy: dtype=<d> dense_dtype=<dd> examples=<n> auc=<a> fp32_auc=<f> auc_ratio=<a/f> max_abs_diff=<m> mean_abs_diff=<e>
//
// (dtype is the tables' precision). It exits 1, after every line, when a
// combination is below MLPerf's target (99 % of float32's AUC with int4
// tables, whatever the dense precision; 99.9 % for every other), and 2 on
// bad flags. No bundle is read: the weights are regenerated from the seed
// exactly as recmesh export draws them, so any cap, the uncapped tables
// included, can be checked.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/recmesh/recmesh/cli/internal/accuracy"
	"github.com/recmesh/recmesh/model"
)

// Defaults: make bench-accuracy's run. The hostbound preset keeps the
// benchmark's tables and ids, which are what the table precisions change,
// and its dense network is one 13→128 layer and one logit, so a million
// examples at twelve combinations take minutes in plain Go (the MLPerf
// network's 16 M weights would take hours on two cores, once per dense
// precision).
const (
	defaultPreset   = model.PresetHostbound
	defaultMaxVocab = model.BenchVocabCap
	defaultExamples = 1_000_000
	// The benchmark bundles' weight seed and the load generator's input
	// seed (make bench, bench/cmd/loadgen -seed).
	defaultSeed      = 1
	defaultInputSeed = 1
	defaultLabelSeed = 1
	// defaultTableMiB holds the cap-850000 tables (3.2 GB in float32);
	// one precision's tables are in memory at a time.
	defaultTableMiB = 4096
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks a bad flag value.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := runErr(ctx, args, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "accuracy: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "accuracy: %v\n", err)
	return 1
}

func runErr(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("accuracy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	preset := fs.String("preset", defaultPreset, "dense network `name`: "+strings.Join(model.PresetNames(), " or ")+" (as recmesh export)")
	maxVocab := fs.Int("max-vocab", defaultMaxVocab, "cap on every table's `rows`; 0 means uncapped (tables beyond -table-memory-mib are regenerated per read)")
	seed := fs.Uint64("seed", defaultSeed, "`seed` the weights are drawn from (as recmesh export)")
	inputSeed := fs.Uint64("input-seed", defaultInputSeed, "`seed` of the examples (as the benchmark's load generator)")
	examples := fs.Int("examples", defaultExamples, "`number` of examples")
	labelSeed := fs.Uint64("label-seed", defaultLabelSeed, "`seed` the labels are drawn with")
	dtypes := fs.String("dtypes", "fp32,fp16,int8,int4", "comma-separated table `precisions` to score (fp32 always is, first)")
	denseDtypes := fs.String("dense-dtypes", "fp32,fp16,bf16",
		"comma-separated dense `precisions` to score, each with every table precision (fp32 always is, first)")
	tableMiB := fs.Int64("table-memory-mib", defaultTableMiB, "`MiB` of tables to hold in memory, in float32")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	case *examples < 2:
		return fmt.Errorf("%w: -examples is %d; want at least 2", errUsage, *examples)
	case *maxVocab < 0:
		return fmt.Errorf("%w: -max-vocab is %d; want 0 (uncapped) or more", errUsage, *maxVocab)
	case *tableMiB < 0:
		return fmt.Errorf("%w: -table-memory-mib is %d; want 0 or more", errUsage, *tableMiB)
	}
	if _, err := model.Preset(*preset, 0); err != nil {
		return fmt.Errorf("%w: -preset: %v", errUsage, err)
	}
	ds, err := accuracy.ParseDtypes(*dtypes)
	if err != nil {
		return fmt.Errorf("%w: -dtypes: %v", errUsage, err)
	}
	dds, err := accuracy.ParseDenseDtypes(*denseDtypes)
	if err != nil {
		return fmt.Errorf("%w: -dense-dtypes: %v", errUsage, err)
	}

	start := time.Now()
	res, err := accuracy.Run(ctx, accuracy.Options{
		Preset: *preset, MaxVocab: *maxVocab, Seed: *seed,
		InputSeed: *inputSeed, Examples: *examples, LabelSeed: *labelSeed,
		Dtypes: ds, DenseDtypes: dds, TableMemory: *tableMiB << 20, Log: stderr,
	}, func(l accuracy.Line) { fmt.Fprintln(stdout, l) })
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "accuracy: preset=%s max_vocab=%d seed=%d input_seed=%d label_seed=%d k=%.6g c=%.6g positives=%d in %.1fs\n",
		*preset, *maxVocab, *seed, *inputSeed, *labelSeed, res.Calibration.K, res.Calibration.C, res.Positives, time.Since(start).Seconds())
	if f := res.Failures(); len(f) > 0 {
		return fmt.Errorf("below MLPerf's accuracy target: %s", strings.Join(f, "; "))
	}
	return nil
}
