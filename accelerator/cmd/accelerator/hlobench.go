package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gomlx/gopjrt/dtypes"
	"github.com/gomlx/gopjrt/pjrt"

	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// runHLOBench times StableHLO modules on the plugin, one after the other in
// one process, round after round (every other round in reverse order), and
// prints per round and module
//
//	hlo: round=<r> program=<file> calls_per_s=<x> ms_per_call=<y>
//
// then, per module, the median over rounds. Every module gets arguments of
// the shapes and element types its main function declares, filled with
// the same small pseudo-random values (float32 draws, rounded to f16 or
// bf16 where an argument is half; ui16 arguments get bf16 bits, which is
// how JAX passes bf16 weights to a plugin without the type), and is run as
// the executor runs its own: inputs on
// the device, the result copied to the host. `make bench-model` times
// recmesh's program and the one JAX lowers this way, so that the programs
// are compared with everything else held equal: the runtime, the process,
// the moment.
func runHLOBench(ctx context.Context, args []string) error {
	return hloBench(ctx, args, os.Stdout)
}

func hloBench(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("hlobench", flag.ContinueOnError)
	var programs stringList
	fs.Var(&programs, "program", "a StableHLO `file` to time (repeat the flag for more)")
	var dev deviceFlags
	dev.register(fs)
	perProgram := fs.Duration("duration", time.Second, "measured time per program per round (at least 3 calls)")
	rounds := fs.Int("rounds", 3, "rounds over every program")
	fs.Usage = func() { flagenv.Usage(fs) }
	flagenv.DefinePrintConfig(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flagenv.Apply(fs, os.Getenv); err != nil {
		return err
	}
	switch {
	case len(programs) == 0:
		return fmt.Errorf("--program: give at least one StableHLO file")
	case *rounds < 1 || *perProgram <= 0:
		return fmt.Errorf("--rounds %d and --duration %v: want at least 1 and more than 0", *rounds, *perProgram)
	}
	if err := dev.validate(); err != nil {
		return err
	}
	rt, err := dev.openDevice(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	defer rt.Close()
	fmt.Fprintf(stdout, "hlo: plugin=%s api=%s xla_threads=%d cpu_device_count=%d\n", rt.PluginFile(), rt.APIVersion(), rt.Threads, rt.CPUDeviceCount)
	// recmesh's programs may call the strip kernel; without it registered
	// they would not compile. A module that calls it where it cannot be
	// registered fails to compile with the reason below in the log.
	if err := executor.RegisterStripDot(rt); err != nil {
		fmt.Fprintf(os.Stderr, "hlobench: strip kernel not registered: %v\n", err)
	}

	mods := make([]*hloModule, len(programs))
	defer func() {
		for _, m := range mods {
			m.close()
		}
	}()
	for i, file := range programs {
		if mods[i], err = loadHLOModule(rt.Client, file); err != nil {
			return err
		}
	}
	perRound := make([][]float64, len(mods))
	for r := range *rounds {
		order := make([]int, len(mods))
		for i := range order {
			order[i] = i
		}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			calls, el, err := mods[i].time(ctx, *perProgram)
			if err != nil {
				return err
			}
			perRound[i] = append(perRound[i], float64(calls)/el.Seconds())
			fmt.Fprintf(stdout, "hlo: round=%d program=%s calls_per_s=%.2f ms_per_call=%.3f\n",
				r+1, mods[i].file, float64(calls)/el.Seconds(), 1e3*el.Seconds()/float64(calls))
		}
	}
	for i, m := range mods {
		med := median(perRound[i])
		fmt.Fprintf(stdout, "hlo: program=%s calls_per_s=%.2f ms_per_call=%.3f rounds=%d\n", m.file, med, 1e3/med, *rounds)
	}
	return nil
}

// hloModule is one compiled StableHLO module and the arguments it runs on.
type hloModule struct {
	file  string
	exe   *pjrt.LoadedExecutable
	args  []*pjrt.Buffer
	out   []byte
	shape []int
}

func loadHLOModule(c *pjrt.Client, file string) (*hloModule, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("hlobench: %w", err)
	}
	shapes, err := mainArgShapes(string(text))
	if err != nil {
		return nil, fmt.Errorf("hlobench: %s: %w", file, err)
	}
	m := &hloModule{file: filepath.Base(file)}
	if m.exe, err = c.Compile().WithStableHLO(text).Done(); err != nil {
		return nil, fmt.Errorf("hlobench: compile %s: %w", file, err)
	}
	// The same values for every module: one seed, in argument order.
	rng := rand.New(rand.NewPCG(1, 2))
	for i, a := range shapes {
		n := 1
		for _, d := range a.dims {
			n *= d
		}
		raw := make([]byte, n*a.dtype.Size())
		for k := range n {
			v := (rng.Float32() - 0.5) * 0.05
			switch a.dtype {
			case dtypes.Float32:
				binary.NativeEndian.PutUint32(raw[4*k:], math.Float32bits(v))
			case dtypes.Float16:
				binary.NativeEndian.PutUint16(raw[2*k:], model.Float32ToHalf(v))
			default: // bf16, and ui16 carrying bf16's bits
				binary.NativeEndian.PutUint16(raw[2*k:], model.Float32ToBF16(v))
			}
		}
		buf, err := c.BufferFromHost().FromRawData(raw, a.dtype, a.dims).Done()
		if err != nil {
			m.close()
			return nil, fmt.Errorf("hlobench: %s: argument %d: %w", file, i, err)
		}
		m.args = append(m.args, buf)
	}
	return m, nil
}

// time runs the module for at least d and 3 calls, after one warm-up call.
func (m *hloModule) time(ctx context.Context, d time.Duration) (calls int, el time.Duration, err error) {
	if err := m.run(); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	for calls < 3 || time.Since(start) < d {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		if err := m.run(); err != nil {
			return 0, 0, err
		}
		calls++
	}
	return calls, time.Since(start), nil
}

func (m *hloModule) run() error {
	outs, err := m.exe.Execute(m.args...).DonateNone().Done()
	if err != nil {
		return fmt.Errorf("hlobench: run %s: %w", m.file, err)
	}
	defer func() {
		for _, o := range outs {
			o.Destroy()
		}
	}()
	if len(outs) != 1 {
		return fmt.Errorf("hlobench: %s returned %d outputs, want 1", m.file, len(outs))
	}
	n, err := outs[0].Size()
	if err != nil {
		return fmt.Errorf("hlobench: %s: output size: %w", m.file, err)
	}
	if len(m.out) < n {
		m.out = make([]byte, n)
	}
	if err := outs[0].ToHost(m.out[:n]); err != nil {
		return fmt.Errorf("hlobench: %s: copy the output: %w", m.file, err)
	}
	return nil
}

func (m *hloModule) close() {
	if m == nil {
		return
	}
	for _, b := range m.args {
		b.Destroy()
	}
	if m.exe != nil {
		m.exe.Destroy()
	}
}

// mainSignature finds the argument list of a module's main function, in
// the forms jax (func.func public @main) and package dcn write.
var mainSignature = regexp.MustCompile(`func\.func\s+(?:public\s+)?@main\(`)

// argTensor is one argument's name and tensor type.
var argTensor = regexp.MustCompile(`%[\w.]+\s*:\s*tensor<([^>]*)>`)

// argType is one argument of main: its shape and element type.
type argType struct {
	dims  []int
	dtype dtypes.DType
}

// argElements are the element types hlobench can fill.
var argElements = map[string]dtypes.DType{
	"f32":  dtypes.Float32,
	"f16":  dtypes.Float16,
	"bf16": dtypes.BFloat16,
	"ui16": dtypes.Uint16,
}

// mainArgShapes returns the shape and element type of every argument of
// main, which must all be static tensors of f32, f16, bf16 or ui16.
func mainArgShapes(text string) ([]argType, error) {
	loc := mainSignature.FindStringIndex(text)
	if loc == nil {
		return nil, fmt.Errorf("no main function")
	}
	// The argument list ends at the parenthesis that closes the one
	// opening it; attributes ({...}) in between hold no parentheses that
	// matter, but count them all the same.
	depth, end := 1, -1
	for i := loc[1]; i < len(text) && end < 0; i++ {
		switch text[i] {
		case '(':
			depth++
		case ')':
			if depth--; depth == 0 {
				end = i
			}
		}
	}
	if end < 0 {
		return nil, fmt.Errorf("main's argument list does not end")
	}
	var shapes []argType
	for i, m := range argTensor.FindAllStringSubmatch(text[loc[1]:end], -1) {
		parts := strings.Split(m[1], "x")
		dt, ok := argElements[parts[len(parts)-1]]
		if !ok {
			return nil, fmt.Errorf("argument %d is tensor<%s>: only f32, f16, bf16 and ui16 tensors are supported", i, m[1])
		}
		dims := []int{}
		for _, p := range parts[:len(parts)-1] {
			d, err := strconv.Atoi(p)
			if err != nil || d < 0 {
				return nil, fmt.Errorf("argument %d is tensor<%s>: only static shapes are supported", i, m[1])
			}
			dims = append(dims, d)
		}
		shapes = append(shapes, argType{dims, dt})
	}
	if len(shapes) == 0 {
		return nil, fmt.Errorf("main has no tensor arguments")
	}
	return shapes, nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
