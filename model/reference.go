package model

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// refBlock is how many examples Forward pushes through each weight row
// while it is in L1: the dense network is ~64 MB of weights, so streaming it
// once per example would make Forward memory-bound.
const refBlock = 8

// Reference is the plain-Go forward pass every serving path is checked
// against, with no code shared with the PJRT program. Pool defines the
// pooled vectors exactly as the embedder computes them (float32 sums of
// the dequantized rows, see Pool); the dense network runs in float64
// arithmetic throughout, rounded to float32 only where an output is
// stored. The weights are float32 values at every dense precision (a half
// is the float32 it widens to, see DenseDtype). Each output is summed in a
// fixed order, so a score does not depend on the batch it was computed in
// or on the number of goroutines. One from NewReference reads the weights
// from its Bundle (Bundle.Tensor), which must stay open while the
// Reference is used; one from
// NewGeneratedReference draws them as the exporter would, with the same
// results. It is safe for concurrent use.
type Reference struct {
	cfg Config
	// tables are a bundle's fp32 tables (nil at other precisions), or the
	// dequantized rows of NewGeneratedReference's tables at any precision.
	tables [][]float32
	rows   [][]byte // the stored rows of a bundle's tables at other precisions
	// gen regenerates the rows of a table that is in neither tables nor
	// rows (a nil entry, or no entry): NewGeneratedReference's tables too
	// big to hold.
	gen    *rowGenerator
	bottom []denseLayer
	cross  []crossLayer
	top    []denseLayer
}

// denseLayer computes y = x·w + b, w stored [in, out].
type denseLayer struct {
	in, out int
	w, b    []float32
}

// crossLayer computes x_{l+1} = x0 ⊙ ((x_l·v)·u + b) + x_l.
type crossLayer struct {
	dim, rank int
	v, u, b   []float32
}

// NewReference builds the reference forward pass over b's weights.
func NewReference(b *Bundle) (*Reference, error) {
	r, err := newReference(b.Config, b.Tensor, b.tableData)
	if err != nil {
		return nil, fmt.Errorf("model: reference for %s: %w", b.Dir, err)
	}
	return r, nil
}

// newReference builds a Reference for any cfg whose widths are consistent,
// including tiny ones that Config.Validate would refuse, so the layer
// arithmetic can be tested by hand; tensor supplies each float32 tensor and
// table (only called when cfg.TableDtype is not fp32) each table's stored
// rows.
func newReference(cfg Config, tensor func(string) ([]float32, error), table func(int) ([]byte, error)) (*Reference, error) {
	r := &Reference{cfg: cfg}
	d := cfg.TableDtype.norm()
	for i, s := range cfg.Tables() {
		if d == DtypeFP32 {
			t, err := checkedTensor(tensor, s)
			if err != nil {
				return nil, err
			}
			r.tables = append(r.tables, t)
			continue
		}
		raw, err := table(i)
		if err != nil {
			return nil, err
		}
		if need := int64(s.Shape[0]) * int64(d.RowBytes(s.Shape[1])); int64(len(raw)) != need {
			return nil, fmt.Errorf("%w: table %q has %d bytes, %d %s rows need %d", ErrMismatch, s.Name, len(raw), s.Shape[0], d, need)
		}
		r.rows = append(r.rows, raw)
	}
	if err := r.loadDense(tensor); err != nil {
		return nil, err
	}
	return r, nil
}

// checkedTensor returns tensor(s.Name), refusing one of the wrong size.
func checkedTensor(tensor func(string) ([]float32, error), s ParamSpec) ([]float32, error) {
	t, err := tensor(s.Name)
	if err != nil {
		return nil, err
	}
	if int64(len(t)) != s.Elements() {
		return nil, fmt.Errorf("%w: tensor %q has %d values, shape %v needs %d", ErrMismatch, s.Name, len(t), s.Shape, s.Elements())
	}
	return t, nil
}

// loadDense sets r's dense network from tensor.
func (r *Reference) loadDense(tensor func(string) ([]float32, error)) error {
	cfg := r.cfg
	get := func(s ParamSpec) ([]float32, error) { return checkedTensor(tensor, s) }
	params := cfg.DenseParams()
	next := func() (ParamSpec, []float32, error) {
		s := params[0]
		params = params[1:]
		t, err := get(s)
		return s, t, err
	}
	dense := func(n int) ([]denseLayer, error) {
		var layers []denseLayer
		for range n {
			ws, w, err := next()
			if err != nil {
				return nil, err
			}
			_, b, err := next()
			if err != nil {
				return nil, err
			}
			layers = append(layers, denseLayer{in: ws.Shape[0], out: ws.Shape[1], w: w, b: b})
		}
		return layers, nil
	}
	var err error
	if r.bottom, err = dense(len(cfg.BottomMLP)); err != nil {
		return err
	}
	for range cfg.CrossLayers {
		vs, v, err := next()
		if err != nil {
			return err
		}
		_, u, err := next()
		if err != nil {
			return err
		}
		_, b, err := next()
		if err != nil {
			return err
		}
		r.cross = append(r.cross, crossLayer{dim: vs.Shape[0], rank: vs.Shape[1], v: v, u: u, b: b})
	}
	if r.top, err = dense(len(cfg.TopMLP)); err != nil {
		return err
	}
	if n := len(r.bottom); n == 0 || r.bottom[n-1].out != cfg.EmbeddingDim {
		return fmt.Errorf("%w: bottom MLP must end at the embedding width %d", ErrInvalidConfig, cfg.EmbeddingDim)
	}
	if n := len(r.top); n == 0 || r.top[n-1].out != 1 {
		return fmt.Errorf("%w: top MLP must end in one output", ErrInvalidConfig)
	}
	return nil
}

// Pool sum-pools each example's bags into pooled, [n, tables, dim] float32.
// It is the definition the embedder's lookup kernels are held to bit for
// bit: each row is dequantized to float32 as Dtype documents (fp32 rows as
// they are), and a bag's rows are summed in float32 in bag order, starting
// from the first row. sparse holds n*SparseWidth ids laid out as
// RandomInputs makes them. An id outside its table is an error naming the
// example and the table; pooled is then partly written.
func (r *Reference) Pool(sparse []int32, n int, pooled []float32) error {
	cfg := r.cfg
	width, dim, tables := cfg.SparseWidth(), cfg.EmbeddingDim, len(cfg.VocabSizes)
	if n < 0 || len(sparse) != n*width || len(pooled) != n*tables*dim {
		return fmt.Errorf("model: pool: %w: %d examples need %d ids and %d pooled values, got %d and %d",
			ErrBadInput, n, n*width, n*tables*dim, len(sparse), len(pooled))
	}
	d, rb := r.cfg.TableDtype, r.cfg.TableDtype.RowBytes(dim)
	maxHot := 0
	for _, h := range cfg.Hotness {
		maxHot = max(maxHot, h)
	}
	// A bag's rows are gathered (dequantized where they are stored at
	// another precision) before they are summed, so their reads overlap.
	deq := make([]float32, maxHot*dim)
	bag := make([][]float32, maxHot)
	var gs *genScratch
	if r.gen != nil {
		gs = r.gen.newScratch()
	}
	for e := range n {
		ids := sparse[e*width : (e+1)*width]
		for t, h := range cfg.Hotness {
			vocab := cfg.VocabSizes[t]
			var fp32 []float32
			var stored []byte
			if t < len(r.tables) {
				fp32 = r.tables[t]
			}
			if t < len(r.rows) {
				stored = r.rows[t]
			}
			for k, id := range ids[:h] {
				if id < 0 || int(id) >= vocab {
					return fmt.Errorf("model: pool: %w: example %d table %d: id %d outside [0, %d)", ErrBadInput, e, t, id, vocab)
				}
				row := deq[k*dim : (k+1)*dim]
				switch {
				case fp32 != nil:
					row = fp32[int(id)*dim : (int(id)+1)*dim]
				case stored != nil:
					d.DequantizeRow(row, stored[int(id)*rb:(int(id)+1)*rb])
				default:
					r.gen.row(gs, t, int(id), row)
				}
				bag[k] = row
			}
			sumBag(pooled[(e*tables+t)*dim:(e*tables+t+1)*dim], bag[:h])
			ids = ids[h:]
		}
	}
	return nil
}

// sumBag sets out to the float32 sum of rows in order, starting from the
// first: ((rows[0] + rows[1]) + rows[2]) + …, each addition rounded. Four
// rows are added per pass, in that order, so four rows' reads are in
// flight at once; the sums are those of adding one row per pass.
func sumBag(out []float32, rows [][]float32) {
	copy(out, rows[0])
	k := 1
	for ; k+4 <= len(rows); k += 4 {
		r0 := rows[k][:len(out)]
		r1, r2, r3 := rows[k+1][:len(out)], rows[k+2][:len(out)], rows[k+3][:len(out)]
		for j := range out {
			v := out[j] + r0[j]
			v += r1[j]
			v += r2[j]
			out[j] = v + r3[j]
		}
	}
	for ; k < len(rows); k++ {
		r0 := rows[k][:len(out)]
		for j := range out {
			out[j] += r0[j]
		}
	}
}

// Forward runs the dense network on n examples: the bottom MLP over dense
// ([n, NumDense]) with ReLU after every layer; the concatenation of its
// output with the pooled vectors ([n, tables, dim]) into x0; the cross
// layers x_{l+1} = x0 ⊙ ((x_l·V_l)·U_l + b_l) + x_l; the top MLP with ReLU
// after every layer but the last; and a sigmoid. Examples are split across
// up to GOMAXPROCS goroutines; scores gets n float32 probabilities.
func (r *Reference) Forward(dense, pooled []float32, n int, scores []float32) error {
	cfg := r.cfg
	pw := len(cfg.VocabSizes) * cfg.EmbeddingDim
	if n < 0 || len(dense) != n*cfg.NumDense || len(pooled) != n*pw || len(scores) != n {
		return fmt.Errorf("model: forward: %w: %d examples need %d dense, %d pooled and %d score values, got %d, %d and %d",
			ErrBadInput, n, n*cfg.NumDense, n*pw, n, len(dense), len(pooled), len(scores))
	}
	blocks := (n + refBlock - 1) / refBlock
	workers := min(runtime.GOMAXPROCS(0), blocks)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			s := r.newScratch()
			for {
				blk := int(next.Add(1) - 1)
				if blk >= blocks {
					return
				}
				lo := blk * refBlock
				hi := min(lo+refBlock, n)
				r.forwardBlock(s, dense[lo*cfg.NumDense:hi*cfg.NumDense], pooled[lo*pw:hi*pw], hi-lo, scores[lo:hi])
			}
		})
	}
	wg.Wait()
	return nil
}

// Predict pools sparse and runs Forward: n scores for n examples.
func (r *Reference) Predict(dense []float32, sparse []int32, n int) ([]float32, error) {
	if n < 0 {
		return nil, fmt.Errorf("model: predict: %w: %d examples", ErrBadInput, n)
	}
	pooled := make([]float32, n*len(r.cfg.VocabSizes)*r.cfg.EmbeddingDim)
	if err := r.Pool(sparse, n, pooled); err != nil {
		return nil, err
	}
	scores := make([]float32, n)
	if err := r.Forward(dense, pooled, n, scores); err != nil {
		return nil, err
	}
	return scores, nil
}

// scratch holds one goroutine's activations for a block of examples.
type scratch struct {
	a, b   []float64 // ping-pong MLP activations, [refBlock, widest layer]
	x0, xl []float64 // cross-layer input and running state, [refBlock, D]
	t      []float64 // x_l·V, [refBlock, rank]
	s      []float64 // (x_l·V)·U + b, [refBlock, D]
}

func (r *Reference) newScratch() *scratch {
	widest := r.cfg.NumDense
	for _, l := range r.bottom {
		widest = max(widest, l.out)
	}
	for _, l := range r.top {
		widest = max(widest, l.in, l.out)
	}
	d := (len(r.cfg.VocabSizes) + 1) * r.cfg.EmbeddingDim
	rank := 0
	for _, c := range r.cross {
		rank = max(rank, c.rank)
	}
	return &scratch{
		a:  make([]float64, refBlock*widest),
		b:  make([]float64, refBlock*widest),
		x0: make([]float64, refBlock*d),
		xl: make([]float64, refBlock*d),
		t:  make([]float64, refBlock*rank),
		s:  make([]float64, refBlock*d),
	}
}

// forwardBlock computes the scores of nb ≤ refBlock examples.
func (r *Reference) forwardBlock(s *scratch, dense, pooled []float32, nb int, scores []float32) {
	cfg := r.cfg
	dim, pw := cfg.EmbeddingDim, len(cfg.VocabSizes)*cfg.EmbeddingDim
	d := dim + pw

	x := s.a[:nb*cfg.NumDense]
	for i, v := range dense {
		x[i] = float64(v)
	}
	x = mlp(r.bottom, x, s.a, s.b, nb, true)

	x0 := s.x0[:nb*d]
	for e := range nb {
		copy(x0[e*d:e*d+dim], x[e*dim:(e+1)*dim])
		for j, v := range pooled[e*pw : (e+1)*pw] {
			x0[e*d+dim+j] = float64(v)
		}
	}
	xl := s.xl[:nb*d]
	copy(xl, x0)
	for _, c := range r.cross {
		t := s.t[:nb*c.rank]
		matmul(xl, c.dim, t, c.rank, nb, c.v, nil)
		sv := s.s[:nb*d]
		matmul(t, c.rank, sv, c.dim, nb, c.u, c.b)
		for k := range xl {
			xl[k] += x0[k] * sv[k]
		}
	}

	x = mlp(r.top, xl, s.a, s.b, nb, false)
	for e := range nb {
		scores[e] = float32(sigmoid(x[e]))
	}
}

// mlp runs layers over the nb rows of x, alternating between the scratch
// buffers a and b, with ReLU after every layer (after all but the last when
// reluLast is false). It returns the last layer's output.
func mlp(layers []denseLayer, x, a, b []float64, nb int, reluLast bool) []float64 {
	for i, l := range layers {
		y := a[:nb*l.out]
		if &y[0] == &x[0] {
			y = b[:nb*l.out]
		}
		matmul(x, l.in, y, l.out, nb, l.w, l.b)
		if reluLast || i < len(layers)-1 {
			for j, v := range y {
				y[j] = max(v, 0)
			}
		}
		x = y
	}
	return x
}

// matmul sets y = x·w + bias for nb rows: x is [nb, in], y is [nb, out], w
// is [in, out] row-major and bias (nil for none) is [out]. Four weight rows
// at a time are applied to all nb rows while they are hot in cache, and
// each y[e][j] stays in a register across the four. Every y[e][j] is summed
// in the order bias, i = 0, 1, …, so the result does not depend on nb.
func matmul(x []float64, in int, y []float64, out int, nb int, w, bias []float32) {
	for e := range nb {
		ye := y[e*out : (e+1)*out]
		if bias == nil {
			clear(ye)
			continue
		}
		for j, v := range bias[:out] {
			ye[j] = float64(v)
		}
	}
	i := 0
	for ; i+4 <= in; i += 4 {
		// Reslicing to len(r0) lets the compiler drop the bounds checks.
		r0 := w[i*out : (i+1)*out]
		r1 := w[(i+1)*out:][:len(r0)]
		r2 := w[(i+2)*out:][:len(r0)]
		r3 := w[(i+3)*out:][:len(r0)]
		for e := range nb {
			xe := x[e*in+i:][:4]
			x0, x1, x2, x3 := xe[0], xe[1], xe[2], xe[3]
			ye := y[e*out:][:len(r0)]
			for j, v := range r0 {
				acc := ye[j] + x0*float64(v)
				acc += x1 * float64(r1[j])
				acc += x2 * float64(r2[j])
				acc += x3 * float64(r3[j])
				ye[j] = acc
			}
		}
	}
	for ; i < in; i++ {
		row := w[i*out : (i+1)*out]
		for e := range nb {
			xi := x[e*in+i]
			ye := y[e*out:][:len(row)]
			for j, v := range row {
				ye[j] += xi * float64(v)
			}
		}
	}
}

func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + math.Exp(-z))
	}
	ez := math.Exp(z)
	return ez / (1 + ez)
}
