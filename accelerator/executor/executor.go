// Package executor owns the compiled DCNv2 program of the accelerator: one
// PJRT executable per power-of-two batch bucket, the dense weights (on the
// CPU plugin: in a huge-page mapping the program reads in place), uploaded
// at load and replaced between two runs by SwapWeights without compiling,
// and the host input regions the executables read.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gomlx/gopjrt/dtypes"
	"github.com/gomlx/gopjrt/pjrt"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/stripdot"
	"github.com/recmesh/recmesh/model"
)

// DefaultMaxBatch is the largest bucket compiled by default.
const DefaultMaxBatch = model.DefaultMaxBatch

// Options configure an Executor. The zero value of every field means its
// default.
type Options struct {
	// MaxBatch is the largest batch; buckets are 1, 2, 4, … up to the first
	// power of two ≥ MaxBatch. Default DefaultMaxBatch.
	MaxBatch int
	// CompileParallelism is how many buckets compile at once. Default
	// GOMAXPROCS: the CPU plugin compiles on the calling thread.
	CompileParallelism int
	// Program tunes the StableHLO program. Default dcn.DefaultOptions().
	Program *dcn.Options
	// Log receives start-up information (compile times). Default: discard.
	Log *slog.Logger
	// CopyScores makes Run fetch the scores with PJRT_Buffer_ToHostBuffer
	// even on the CPU plugin, where by default it reads them in place from
	// the finished output buffer (the copy is one more hand-off to XLA's
	// worker thread per call). It is the plain path of every other plugin.
	CopyScores bool
	// CopyWeights uploads the weights with PJRT_Client_BufferFromHostBuffer
	// into the plugin's own memory even on the CPU plugin, where by default
	// they live in a mapping of the executor's own advised to use huge
	// pages, which the program reads in place. It is the plain path of
	// every other plugin.
	CopyWeights bool
	// StripDot says which buckets compute their products with package
	// stripdot's custom call (CPU plugin, on a CPU with AVX-512F or with
	// AVX2 and FMA, only). Default StripDotAuto.
	StripDot StripDotMode
	// StripDotMaxBucket is the largest bucket that may use the custom call.
	// Default DefaultStripDotMaxBucket.
	StripDotMaxBucket int
}

// StripDotMode selects the buckets whose programs call the strip kernel.
type StripDotMode int

const (
	// StripDotAuto compiles both programs for every bucket up to
	// StripDotMaxBucket, times them alternately at start-up and keeps the
	// faster: where the kernel wins depends on the CPU's memory bandwidth
	// against its arithmetic, which only a measurement on the host knows.
	StripDotAuto StripDotMode = iota
	// StripDotOff never uses the custom call.
	StripDotOff
	// StripDotOn uses it for every bucket up to StripDotMaxBucket (tests
	// and benchmarks of the kernel itself).
	StripDotOn
)

// ParseStripDotMode reads auto, off or on.
func ParseStripDotMode(s string) (StripDotMode, error) {
	switch s {
	case "", "auto":
		return StripDotAuto, nil
	case "off":
		return StripDotOff, nil
	case "on":
		return StripDotOn, nil
	}
	return 0, fmt.Errorf("strip dot mode %q: want auto, off or on", s)
}

// DefaultStripDotMaxBucket is the largest bucket considered for the strip
// kernel by default: above it the product is bound by arithmetic, which
// XLA's blocked kernel does better, not by streaming the weights.
const DefaultStripDotMaxBucket = 64

// Buckets returns the power-of-two buckets 1 … ≥maxBatch.
func Buckets(maxBatch int) []int {
	var out []int
	for b := 1; ; b *= 2 {
		out = append(out, b)
		if b >= maxBatch {
			return out
		}
	}
}

// Executor runs the DCNv2 program. Run calls are serialised: the device is
// one, and the output staging buffer is shared.
type Executor struct {
	log     *slog.Logger // nil: discard
	rt      *device.Runtime
	cfg     model.Config
	buckets []int
	exes    []*pjrt.LoadedExecutable
	// specs are the program's weight arguments, in order.
	specs []dcn.Param
	// params are the weight arguments' buffers, in specs order, and
	// weights the memory they view when inPlace (CPU plugin, unless
	// Options.CopyWeights); both change only under mu (SwapWeights).
	params  []*pjrt.Buffer
	weights *hostWeights
	inPlace bool
	// zeroCopy: the plugin reads host memory in place (CPU); otherwise the
	// inputs are copied to the device per run.
	zeroCopy bool
	// scoresInPlace: Run reads the scores from the output buffer's memory
	// (CPU, unless Options.CopyScores) instead of copying them out.
	scoresInPlace bool
	// stripDot[i] reports whether bucket i's program calls the strip kernel.
	stripDot []bool
	// prog is the program options of the buckets without the strip kernel.
	prog dcn.Options

	// CompileTime is the wall time to compile every bucket.
	CompileTime time.Duration
	// compiles counts the programs compiled (Compiles).
	compiles atomic.Int64

	// swapMu makes one SwapWeights at a time build its buffers.
	swapMu sync.Mutex

	// mu serialises Run, and with it every use of args and params, with
	// the switch of SwapWeights and with Close.
	mu     sync.Mutex
	outBuf []byte
	args   []*pjrt.Buffer
}

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("executor: closed")

// New compiles the program for every bucket, uploads the dense weights of
// bundle and checks the plugin with one run of the smallest bucket.
func New(ctx context.Context, rt *device.Runtime, bundle *model.Bundle, opts Options) (*Executor, error) {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.CompileParallelism <= 0 {
		opts.CompileParallelism = runtime.GOMAXPROCS(0)
	}
	prog := dcn.DefaultOptions()
	if opts.Program != nil {
		prog = *opts.Program
	}
	cfg := bundle.Config
	e := &Executor{
		log:      opts.Log,
		rt:       rt,
		cfg:      cfg,
		buckets:  Buckets(opts.MaxBatch),
		zeroCopy: rt.Client.Platform() == "cpu",
	}
	e.scoresInPlace = e.zeroCopy && !opts.CopyScores
	e.exes = make([]*pjrt.LoadedExecutable, len(e.buckets))
	e.stripDot = make([]bool, len(e.buckets))
	e.outBuf = make([]byte, e.MaxBucket()*4)

	stripMax := e.stripDotBuckets(opts)
	prog.PackedWeights = stripMax > 0
	prog.PackedElement = dcn.ElementOf(cfg.DenseDtype)
	e.prog = prog
	e.inPlace = e.zeroCopy && !opts.CopyWeights
	e.specs = dcn.Params(cfg, prog)
	values, err := paramValues(cfg, e.specs, bundleSource(bundle))
	if err != nil {
		e.Close()
		return nil, err
	}
	if e.weights, e.params, err = e.placeWeights(values); err != nil {
		e.Close()
		return nil, err
	}
	e.args = make([]*pjrt.Buffer, dcn.ArgParams+len(e.params))
	copy(e.args[dcn.ArgParams:], e.params)

	start := time.Now()
	// strips[i] is bucket i's program with the strip kernel, compiled
	// beside the plain one for the buckets up to stripMax.
	strips := make([]*pjrt.LoadedExecutable, len(e.buckets))
	type job struct {
		i     int
		strip bool
	}
	var jobs []job
	for i, b := range e.buckets {
		if b <= stripMax {
			jobs = append(jobs, job{i, true})
		}
		if b > stripMax || opts.StripDot == StripDotAuto {
			jobs = append(jobs, job{i, false})
		}
	}
	sem := make(chan struct{}, opts.CompileParallelism)
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for j, jb := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[j] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			b, o := e.buckets[jb.i], prog
			o.StripDot = jb.strip
			text, err := dcn.Build(cfg, b, o)
			if err != nil {
				errs[j] = err
				return
			}
			t0 := time.Now()
			e.compiles.Add(1)
			exe, err := rt.Client.Compile().WithStableHLO(text).Done()
			if err != nil {
				errs[j] = fmt.Errorf("executor: compile bucket %d (strip dot %t): %w", b, jb.strip, err)
				return
			}
			if jb.strip {
				strips[jb.i] = exe
			} else {
				e.exes[jb.i] = exe
			}
			if opts.Log != nil {
				opts.Log.Debug("compiled bucket", "bucket", b, "strip_dot", jb.strip, "seconds", time.Since(t0).Seconds())
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, x := range strips {
			if x != nil {
				x.Destroy()
			}
		}
		e.Close()
		return nil, err
	}
	e.CompileTime = time.Since(start)
	if err := e.chooseStripDot(strips); err != nil {
		e.Close()
		return nil, err
	}
	if opts.Log != nil {
		opts.Log.Info("compiled DCNv2", "buckets", len(e.buckets), "max_bucket", e.MaxBucket(),
			"seconds", e.CompileTime.Seconds(), "zero_copy_inputs", e.zeroCopy)
	}
	if err := e.smoke(); err != nil {
		e.Close()
		return nil, fmt.Errorf("executor: plugin %s (PJRT API %s, binding %d.%d) cannot run the program: %w",
			rt.PluginFile(), rt.APIVersion(), device.BindingAPIMajor, device.BindingAPIMinor, err)
	}
	return e, nil
}

// stripDotBuckets registers the strip kernel with the plugin when opts and
// the plugin allow it, and returns the largest bucket that may use it (0:
// none).
func (e *Executor) stripDotBuckets(opts Options) int {
	if opts.StripDot == StripDotOff {
		return 0
	}
	limit := opts.StripDotMaxBucket
	if limit <= 0 {
		limit = DefaultStripDotMaxBucket
	}
	if err := RegisterStripDot(e.rt); err != nil {
		if e.log != nil {
			e.log.Info("strip kernel not used", "reason", err.Error())
		}
		return 0
	}
	if e.log != nil {
		// The race's figures mean little without knowing which kernel ran.
		e.log.Info("strip kernel registered", "kernel", stripdot.Kernel(), "prefetch_bytes", stripdot.Prefetch())
	}
	return limit
}

// RegisterStripDot registers package stripdot's handler with rt's plugin,
// or says why it cannot: a CPU with neither AVX-512F nor AVX2 and FMA (the
// handler runs the fastest kernel the CPU has), a plugin that is not the
// CPU one, or one of another PJRT version than the checked one (the FFI
// extension's registration arguments changed layout between versions).
// Registering again is harmless.
func RegisterStripDot(rt *device.Runtime) error {
	switch {
	case !stripdot.Supported():
		return stripdot.ErrUnsupported
	case rt.Client.Platform() != "cpu":
		return fmt.Errorf("stripdot: platform %s: the kernel runs only on the CPU plugin", rt.Client.Platform())
	case rt.APIMajor != device.BindingAPIMajor || rt.APIMinor != device.BindingAPIMinor:
		return fmt.Errorf("stripdot: PJRT API %d.%d: the kernel is registered only with %d.%d",
			rt.APIMajor, rt.APIMinor, device.BindingAPIMajor, device.BindingAPIMinor)
	}
	return stripdot.Register(rt.Plugin.Path())
}

// chooseStripDot settles, for each bucket compiled both ways, which
// program serves it: the strip one (StripDotOn), or the faster of the two
// over alternating timed runs (StripDotAuto). The other is destroyed.
func (e *Executor) chooseStripDot(strips []*pjrt.LoadedExecutable) error {
	// Whatever is still in strips when this returns was neither adopted
	// nor destroyed (an error cut the race short).
	defer func() {
		for _, x := range strips {
			if x != nil {
				x.Destroy()
			}
		}
	}()
	largest := 0
	for i, strip := range strips {
		if strip == nil {
			continue
		}
		if e.exes[i] == nil { // StripDotOn: nothing to race
			e.exes[i], e.stripDot[i], strips[i] = strip, true, nil
			continue
		}
		largest = e.buckets[i]
	}
	if largest == 0 {
		return nil
	}
	in, err := e.NewHostInputs(largest)
	if err != nil {
		return err
	}
	defer in.Close()
	for i, strip := range strips {
		if strip == nil {
			continue
		}
		plain, b := e.exes[i], e.buckets[i]
		plainTime, stripTime, err := e.race(i, plain, strip, in)
		if err != nil {
			return fmt.Errorf("executor: time bucket %d: %w", b, err)
		}
		if stripTime < plainTime {
			e.exes[i], e.stripDot[i] = strip, true
			plain.Destroy()
		} else {
			strip.Destroy()
		}
		strips[i] = nil
		if e.log != nil {
			e.log.Info("strip kernel timed", "bucket", b, "plain_ms", msec(plainTime), "strip_ms", msec(stripTime),
				"strip_dot", e.stripDot[i])
		}
	}
	return nil
}

// raceRounds is how many turns of each program the start-up comparison
// times, alternating so that drift in the host's speed hits both alike;
// raceTurn is how many runs back to back make a turn, of which only the
// last is timed.
const (
	raceRounds = 5
	raceTurn   = 2
)

// race times the two programs of bucket i and returns each one's fastest
// run. The race runs at start-up, when the rest of the mesh is loading
// (on one core the embedder reads its tables meanwhile), and what shares
// the core only ever adds time: the fastest run is the least disturbed
// one. (With the median, a race during the embedder's start chose the
// dot program for bucket 1 at 4.3 against 4.8 ms, where quiet runs put
// the kernel 10 % ahead.) A timed run follows a run of the same program,
// as it does when serving, where a bucket's calls come in streaks: timed
// right after its rival, in the caches as the rival left them, the kernel
// tied the dot program at bucket 1 on an AMD EPYC (Zen 5) where it runs
// 12-15 % faster in streaks (figures in docs/design.md).
func (e *Executor) race(i int, a, b *pjrt.LoadedExecutable, in *Inputs) (time.Duration, time.Duration, error) {
	var ta, tb []time.Duration
	for r := 0; r <= raceRounds; r++ {
		for _, x := range []*pjrt.LoadedExecutable{a, b} {
			for run := range raceTurn {
				t0 := time.Now()
				outs, err := e.execute(x, in, i)
				if err != nil {
					return 0, 0, err
				}
				d := time.Since(t0)
				for _, o := range outs {
					o.Destroy()
				}
				if r == 0 || run < raceTurn-1 {
					continue // warm-up: first touch of the weights and code, or the rival's cache state
				}
				if x == a {
					ta = append(ta, d)
				} else {
					tb = append(tb, d)
				}
			}
		}
	}
	return slices.Min(ta), slices.Min(tb), nil
}

func msec(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Program returns the options bucket b's program was built with.
func (e *Executor) Program(b int) dcn.Options {
	o := e.prog
	o.StripDot = e.StripDot(b)
	return o
}

// StripDot reports whether the program of bucket b calls the strip kernel.
func (e *Executor) StripDot(b int) bool {
	for i, x := range e.buckets {
		if x == b {
			return e.stripDot[i]
		}
	}
	return false
}

// smoke runs the smallest bucket once on zeros: a plugin whose ABI does not
// match the binding fails here, at start-up, rather than on the first request.
func (e *Executor) smoke() error {
	in, err := e.NewHostInputs(1)
	if err != nil {
		return err
	}
	defer in.Close()
	scores := make([]float32, 1)
	if err := e.Run(in, 1, scores); err != nil {
		return err
	}
	if scores[0] != scores[0] || scores[0] < 0 || scores[0] > 1 {
		return fmt.Errorf("smoke run gave score %v, want a value in [0,1]", scores[0])
	}
	return nil
}

// Buckets lists the compiled buckets in ascending order.
func (e *Executor) Buckets() []int { return e.buckets }

// MaxBucket is the largest compiled bucket.
func (e *Executor) MaxBucket() int { return e.buckets[len(e.buckets)-1] }

// BucketFor returns the smallest bucket ≥ n and its index.
func (e *Executor) BucketFor(n int) (bucket, index int, err error) {
	if n <= 0 || n > e.MaxBucket() {
		return 0, 0, fmt.Errorf("executor: batch of %d examples outside 1..%d", n, e.MaxBucket())
	}
	for i, b := range e.buckets {
		if b >= n {
			return b, i, nil
		}
	}
	panic("unreachable")
}

// Config is the model the program was built for.
func (e *Executor) Config() model.Config { return e.cfg }

// ZeroCopy reports whether inputs are read in place from host memory.
func (e *Executor) ZeroCopy() bool { return e.zeroCopy }

// Run executes n examples from in (dense rows [0,n) and pooled rows [0,n))
// in the smallest bucket ≥ n and writes n scores. Rows n … bucket-1 of in
// are padding: each output row of the network depends only on its own input
// row, so whatever they hold never reaches scores.
func (e *Executor) Run(in *Inputs, n int, scores []float32) error {
	bucket, idx, err := e.BucketFor(n)
	if err != nil {
		return err
	}
	if n > in.rows {
		return fmt.Errorf("executor: batch of %d examples exceeds the input region's %d rows", n, in.rows)
	}
	if len(scores) < n {
		return fmt.Errorf("executor: scores has room for %d, need %d", len(scores), n)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.exes == nil {
		return ErrClosed
	}
	outs, err := e.execute(e.exes[idx], in, idx)
	if err != nil {
		return err
	}
	defer func() {
		for _, o := range outs {
			o.Destroy()
		}
	}()
	if len(outs) != 1 {
		return fmt.Errorf("executor: bucket %d returned %d outputs, want 1", bucket, len(outs))
	}
	if e.scoresInPlace {
		p, err := outs[0].UnsafePointer()
		if err != nil {
			return fmt.Errorf("executor: scores of bucket %d: %w", bucket, err)
		}
		copy(scores[:n], unsafe.Slice((*float32)(p), n))
		return nil
	}
	if err := outs[0].ToHost(e.outBuf[:bucket*4]); err != nil {
		return fmt.Errorf("executor: read scores of bucket %d: %w", bucket, err)
	}
	copy(scores[:n], unsafe.Slice((*float32)(unsafe.Pointer(&e.outBuf[0])), n))
	return nil
}

// execute runs exe, the program of bucket index idx, on in's rows. Done
// returns once the execution has finished (it awaits the device's
// completion event). The caller destroys the outputs; e.mu is held or e is
// not yet shared.
func (e *Executor) execute(exe *pjrt.LoadedExecutable, in *Inputs, idx int) ([]*pjrt.Buffer, error) {
	bucket := e.buckets[idx]
	var dense, pooled *pjrt.Buffer
	if e.zeroCopy {
		dense, pooled = in.views[idx][0], in.views[idx][1]
	} else {
		var err error
		if dense, pooled, err = in.copyToDevice(e.rt.Client, e.cfg, bucket); err != nil {
			return nil, err
		}
		defer dense.Destroy()
		defer pooled.Destroy()
	}
	e.args[dcn.ArgDense], e.args[dcn.ArgPooled] = dense, pooled
	outs, err := exe.Execute(e.args...).DonateNone().Done()
	e.args[dcn.ArgDense], e.args[dcn.ArgPooled] = nil, nil
	if err != nil {
		return nil, fmt.Errorf("executor: execute bucket %d: %w", bucket, err)
	}
	return outs, nil
}

// Close releases the executables and the weights.
func (e *Executor) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, x := range e.exes {
		if x != nil {
			x.Destroy()
		}
	}
	e.exes = nil
	for _, p := range e.params {
		if p != nil {
			p.Destroy()
		}
	}
	e.params = nil
	e.weights.unmap()
	e.weights = nil
}

// dtype of every tensor of the program.
const f32 = dtypes.Float32
