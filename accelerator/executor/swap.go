package executor

import (
	"fmt"
	"slices"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/model"
)

// SwapWeights replaces the dense weights the compiled programs run with by
// params: every dense parameter of Config().DenseParams() by name, float32,
// row-major in its shape (what model.ReadDenseWeights returns). Nothing is
// compiled: the programs take the weights as arguments, and only the
// arguments change.
//
// The new weights are made exactly as New makes a bundle's: at a half
// dense precision each value is rounded to the nearest half, ties to even,
// as the export rounds it (model.DenseDtype.Stored), so the weights served
// after a swap are, byte for byte, those of a bundle exported with params.
// They are built beside the serving ones (sliced, packed into strips and
// copied into a new mapping, or uploaded), while batches keep running on
// the old; then, between two runs (Run holds the lock a whole batch long),
// the arguments switch to them; and the old buffers are freed once the
// switch is made, since no run can still use them. For that moment the
// process holds two copies of the weights.
//
// A parameter that is missing or of the wrong size, a name the model does
// not have, or a value that is not finite (or whose half is not) is
// refused, naming the tensor, and the old weights keep serving. Swaps are
// serialised with each other; after Close it returns ErrClosed.
func (e *Executor) SwapWeights(params map[string][]float32) error {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	if e.closed() {
		return ErrClosed
	}
	src, err := swapSource(e.cfg, params)
	if err != nil {
		return err
	}
	values, err := paramValues(e.cfg, e.specs, src)
	if err != nil {
		return err
	}
	w, bufs, err := e.placeWeights(values)
	if err != nil {
		return err
	}

	e.mu.Lock()
	if e.exes == nil { // closed while the new weights were built
		e.mu.Unlock()
		destroyAll(bufs)
		w.unmap()
		return ErrClosed
	}
	oldW, oldBufs := e.weights, e.params
	e.weights, e.params = w, bufs
	copy(e.args[dcn.ArgParams:], bufs)
	e.mu.Unlock()

	// No run holds the old buffers: a run takes mu for its whole length,
	// and every run from now reads the new arguments.
	destroyAll(oldBufs)
	oldW.unmap()
	return nil
}

// swapSource checks params against cfg's dense parameters and gives them
// as a bundle of cfg exported with those weights would.
func swapSource(cfg model.Config, params map[string][]float32) (denseSource, error) {
	specs := cfg.DenseParams()
	values := make(map[string][]float32, len(specs))
	halves := make(map[string][]uint16, len(specs))
	for name := range params {
		if !slices.ContainsFunc(specs, func(s model.ParamSpec) bool { return s.Name == name }) {
			return nil, fmt.Errorf("executor: new dense weights: tensor %q is not a dense parameter of model %s", name, cfg.ID())
		}
	}
	for _, s := range specs {
		v, ok := params[s.Name]
		if !ok {
			return nil, fmt.Errorf("executor: new dense weights: tensor %s is missing", s.Name)
		}
		if int64(len(v)) != s.Elements() {
			return nil, fmt.Errorf("executor: new dense weights: tensor %s has %d values, the model's shape %v holds %d", s.Name, len(v), s.Shape, s.Elements())
		}
		var err error
		if values[s.Name], halves[s.Name], err = cfg.DenseDtype.Stored(v); err != nil {
			return nil, fmt.Errorf("executor: new dense weights: tensor %s %w", s.Name, err)
		}
	}
	return func(name string) ([]float32, []uint16, error) {
		v, ok := values[name]
		if !ok {
			return nil, nil, fmt.Errorf("tensor %q: %w", name, model.ErrNoTensor)
		}
		return v, halves[name], nil
	}, nil
}

// closed reports whether Close has run.
func (e *Executor) closed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.exes == nil
}

// Compiles is how many programs the executor compiled: every bucket once,
// and the buckets whose programs raced for the strip kernel twice. It
// never changes after New; SwapWeights compiles nothing.
func (e *Executor) Compiles() int { return int(e.compiles.Load()) }
