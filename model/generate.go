package model

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"unsafe"
)

// Every weight is value i of a counter-based stream keyed by (seed, the
// tensor's place in the bundle), so any row of any table can be drawn on
// its own, exactly as Export draws it, with no bundle on disk. That is what
// lets a check cover tables nobody can export here (the uncapped tables
// are 104 GB in float32) and every precision of a seed without writing four
// bundles: the rows are regenerated, and quantized by the same QuantizeRow
// the exporter calls.

// streamIndex returns the stream index Export draws the tensor named name
// from (its place in the bundle: the tables, then the dense parameters),
// and its spec.
func streamIndex(cfg Config, name string) (int, ParamSpec, bool) {
	for i, s := range bundleSpecs(cfg) {
		if s.Name == name {
			return i, s, true
		}
	}
	return 0, ParamSpec{}, false
}

// GenerateRow sets dst (EmbeddingDim values) to row row of embedding table
// table as Export draws it from seed for cfg: the float32 row before any
// quantization, which a bundle at another precision stores quantized by
// Dtype.QuantizeRow. Only the vocabulary sizes and the table count of cfg
// matter, so a row does not depend on the dense network or the precision.
func GenerateRow(cfg Config, seed uint64, table, row int, dst []float32) error {
	if table < 0 || table >= len(cfg.VocabSizes) {
		return fmt.Errorf("model: generate row: %w: table %d, the model has %d", ErrBadInput, table, len(cfg.VocabSizes))
	}
	if row < 0 || row >= cfg.VocabSizes[table] {
		return fmt.Errorf("model: generate row: %w: row %d outside table %d's [0, %d)", ErrBadInput, row, table, cfg.VocabSizes[table])
	}
	if len(dst) != cfg.EmbeddingDim {
		return fmt.Errorf("model: generate row: %w: %d values, a row has %d", ErrBadInput, len(dst), cfg.EmbeddingDim)
	}
	newStream(seed, domainWeights, uint64(table)).uniformFill(dst, uint64(row)*uint64(cfg.EmbeddingDim), tableBound)
	return nil
}

// GenerateTensor returns the named tensor (a dense parameter, or a table)
// as Export draws it from seed for cfg, in float32 before any rounding: a
// bundle at another precision stores a table quantized by Dtype.QuantizeRow
// and a dense parameter rounded by DenseDtype.Round. Like GenerateRow, it
// gives one set of values for every precision of a seed.
func GenerateTensor(cfg Config, seed uint64, name string) ([]float32, error) {
	i, spec, ok := streamIndex(cfg, name)
	if !ok {
		return nil, fmt.Errorf("model: generate tensor %q: %w", name, ErrNoTensor)
	}
	t := make([]float32, spec.Elements())
	fillParallel(len(t), exportChunkElems, func(lo, hi int) {
		newStream(seed, domainWeights, uint64(i)).uniformFill(t[lo:hi], uint64(lo), initBound(spec))
	})
	return t, nil
}

// NewGeneratedReference returns the Reference of the bundle Export would
// write for cfg and seed, at cfg.TableDtype and cfg.DenseDtype, without
// one: its scores and pooled vectors are bit for bit those of NewReference
// over that bundle. The dense network is generated into memory, rounded
// to cfg.DenseDtype as Export rounds it. Tables are generated into
// memory, the smallest first, while they fit in tableMemory bytes; the
// rest are regenerated on every read (128 hash evaluations and a
// quantization per row read rather than one memory read, several times
// slower, but no table is too big). A table in memory holds its rows
// dequantized, in float32 at every precision (4·EmbeddingDim bytes a row):
// the values a bundle's rows dequantize to, computed once rather than on
// every read.
func NewGeneratedReference(cfg Config, seed uint64, tableMemory int64) (*Reference, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("model: generated reference: %w", err)
	}
	cfg.Seed = seed
	cfg.TableDtype = cfg.TableDtype.norm()
	cfg.DenseDtype = cfg.DenseDtype.norm()
	g := &rowGenerator{dtype: cfg.TableDtype, dim: cfg.EmbeddingDim}
	order := make([]int, len(cfg.VocabSizes))
	for t := range cfg.VocabSizes {
		g.streams = append(g.streams, newStream(seed, domainWeights, uint64(t)))
		order[t] = t
	}
	r := &Reference{cfg: cfg, gen: g, tables: make([][]float32, len(cfg.VocabSizes))}
	// Smallest first: the small tables are read most often per row.
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cfg.VocabSizes[a], cfg.VocabSizes[b]) })
	left := tableMemory
	for _, t := range order {
		bytes := int64(cfg.VocabSizes[t]) * int64(4*g.dim)
		if bytes > left {
			break
		}
		left -= bytes
		r.tables[t] = g.table(t, cfg.VocabSizes[t])
	}
	dense := func(name string) ([]float32, error) {
		t, err := GenerateTensor(cfg, seed, name)
		if err != nil {
			return nil, err
		}
		cfg.DenseDtype.roundAll(t)
		return t, nil
	}
	if err := r.loadDense(dense); err != nil {
		return nil, fmt.Errorf("model: generated reference: %w", err)
	}
	return r, nil
}

// rowGenerator draws table rows as Export does, with the values a bundle
// at one precision stores.
type rowGenerator struct {
	dtype   Dtype
	dim     int
	streams []stream // one per table
}

// genScratch is one goroutine's buffers for rowGenerator.row.
type genScratch struct {
	vals []float32
	buf  []byte
}

func (g *rowGenerator) newScratch() *genScratch {
	return &genScratch{vals: make([]float32, g.dim), buf: make([]byte, g.dtype.RowBytes(g.dim))}
}

// row sets dst to row id of table t as a bundle at g's precision holds it,
// dequantized: the float32 row stored by QuantizeRow and read back by
// DequantizeRow, the path NewReference's Pool takes over a bundle.
func (g *rowGenerator) row(s *genScratch, t, id int, dst []float32) {
	g.streams[t].uniformFill(s.vals, uint64(id)*uint64(g.dim), tableBound)
	if err := g.dtype.QuantizeRow(s.buf, s.vals); err != nil {
		// Every value lies in ±tableBound, which every precision holds.
		panic(fmt.Sprintf("model: regenerate table %d row %d: %v", t, id, err))
	}
	g.dtype.DequantizeRow(dst, s.buf)
}

// table generates table t (vocab rows) as row does, into memory.
func (g *rowGenerator) table(t, vocab int) []float32 {
	out := make([]float32, vocab*g.dim)
	adviseHuge(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), 4*len(out)))
	if g.dtype == DtypeFP32 {
		fillParallel(len(out), exportChunkElems, func(lo, hi int) {
			g.streams[t].uniformFill(out[lo:hi], uint64(lo), tableBound)
		})
		return out
	}
	fillParallel(vocab, exportChunkElems/g.dim, func(lo, hi int) {
		s := g.newScratch()
		for id := lo; id < hi; id++ {
			g.row(s, t, id, out[id*g.dim:(id+1)*g.dim])
		}
	})
	return out
}

// fillParallel calls fill over [0, n) in chunks of at most chunk, on up to
// GOMAXPROCS goroutines. Each chunk's output depends only on its bounds.
func fillParallel(n, chunk int, fill func(lo, hi int)) {
	chunks := (n + chunk - 1) / chunk
	var wg sync.WaitGroup
	next := make(chan int, chunks)
	for c := range chunks {
		next <- c
	}
	close(next)
	for range min(runtime.GOMAXPROCS(0), chunks) {
		wg.Go(func() {
			for c := range next {
				fill(c*chunk, min((c+1)*chunk, n))
			}
		})
	}
	wg.Wait()
}
