package embedder

import (
	"bytes"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/embedder/lookup"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// payloadRig is the embedder's request reading without a segment: a lane
// arena (page-aligned, as in a segment), small tables whose rows hold small
// integers (so any order of summing gives the exact pooled value), and one
// worker.
type payloadRig struct {
	cfg      model.Config
	maxBatch int
	arena    []byte
	tables   [][]float32
	w        *worker
}

const payloadVocab = 8 // rows per table: most random ids are out of range

func newPayloadRig(tb testing.TB) *payloadRig {
	tb.Helper()
	cfg := model.DLRMv2(payloadVocab)
	r := &payloadRig{cfg: cfg, maxBatch: 64}
	for t, v := range cfg.VocabSizes {
		rows := make([]float32, v*lookup.Dim)
		for i := range rows {
			rows[i] = float32((t*7 + i*3) % 17)
		}
		r.tables = append(r.tables, rows)
	}
	tables, err := lookup.NewTables(r.tables, cfg.Hotness)
	if err != nil {
		tb.Fatal(err)
	}
	size := cfg.Request(r.maxBatch).Size + 2*shm.PageSize
	if r.arena, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Munmap(r.arena) })
	e := &Embedder{opts: Options{Mode: batch.Model, MaxBatch: r.maxBatch}, m: newMetrics(prometheus.NewRegistry())}
	r.w = newWorker(e, &Store{Config: cfg, Tables: tables})
	return r
}

// pool is the plain reference of a worker's lookups: the pooled rows of
// ids, or ok=false when an id is outside its table.
func (r *payloadRig) pool(ids []int32, n int) (pooled []float32, ok bool) {
	cfg := r.cfg
	tables, width := len(cfg.VocabSizes), cfg.SparseWidth()
	pooled = make([]float32, n*tables*lookup.Dim)
	for e := range n {
		bag := ids[e*width : (e+1)*width]
		for t, h := range cfg.Hotness {
			out := pooled[(e*tables+t)*lookup.Dim : (e*tables+t+1)*lookup.Dim]
			for _, id := range bag[:h] {
				if id < 0 || int(id) >= cfg.VocabSizes[t] {
					return nil, false
				}
				for k, v := range r.tables[t][int(id)*lookup.Dim : (int(id)+1)*lookup.Dim] {
					out[k] += v
				}
			}
			bag = bag[h:]
		}
	}
	return pooled, true
}

// read runs a request through decodeRequest and, when it is accepted, the
// lookup jobs place would give the workers, into a fresh batch whose one
// task is then settled as seal would.
func (r *payloadRig) read(req *shm.Request) (p model.RequestPayload, st shm.Status, b *openBatch) {
	p, st = decodeRequest(r.cfg, r.maxBatch, req)
	if st != shm.StatusOK {
		return p, st, nil
	}
	per := len(r.cfg.VocabSizes) * lookup.Dim
	n := req.Examples
	b = &openBatch{pooled: make([]float32, n*per), dense: make([]float32, n*r.cfg.NumDense), tasks: batch.NewTasks(1)}
	k := b.tasks.Add(batch.Task{Examples: n})
	for first := 0; first < n; first += DefaultChunk {
		b.wg.Add(1)
		r.w.run(job{b: b, entry: k, payload: p, first: first, n: min(DefaultChunk, n-first), row: first})
	}
	b.tasks.Settle(k, time.Now(), notCanceled{})
	return p, st, b
}

// notCanceled is a batch.Canceler whose callers never give up.
type notCanceled struct{}

func (notCanceled) Canceled(lane, slot int) bool { return false }

// lookupStatus is the outcome the batch's one task was settled with.
func (b *openBatch) lookupStatus() shm.Status { return b.tasks.At(0).Status() }

// validPayload encodes a request of n examples with every id in range.
func (r *payloadRig) validPayload(tb testing.TB, n int) []byte {
	lay := r.cfg.Request(n)
	p := model.RequestPayload{Dense: make([]float32, lay.SparseOffset/4), Sparse: make([]int32, (lay.Size-lay.SparseOffset)/4)}
	for i := range p.Dense {
		p.Dense[i] = float32(i) / 4
	}
	for e, i := 0, 0; e < n; e++ {
		for t, h := range r.cfg.Hotness {
			for j := range h {
				p.Sparse[i] = int32((e + j) % r.cfg.VocabSizes[t])
				i++
			}
		}
	}
	b := make([]byte, lay.Size)
	if err := lay.EncodePayload(b, p); err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestDecodeRequest: a request the frontend encoded is read back exactly,
// and one whose size, count or alignment is wrong is refused before any
// view is made.
func TestDecodeRequest(t *testing.T) {
	r := newPayloadRig(t)
	n := DefaultChunk + 3 // two lookup jobs
	enc := r.validPayload(t, n)
	copy(r.arena, enc)
	req := shm.Request{SlotHeader: shm.SlotHeader{Examples: n, PayloadLength: len(enc)}, Payload: r.arena[:len(enc)]}
	p, st, b := r.read(&req)
	if st != shm.StatusOK {
		t.Fatalf("a valid request: status %v", st)
	}
	ref, _ := r.cfg.Request(n).DecodePayload(enc)
	if !slices.Equal(p.Dense, ref.Dense) || !slices.Equal(p.Sparse, ref.Sparse) {
		t.Fatal("decoded arrays differ from what was encoded")
	}
	want, _ := r.pool(ref.Sparse, n)
	if got := b.lookupStatus(); got != shm.StatusOK || !slices.Equal(b.pooled, want) || !slices.Equal(b.dense, ref.Dense) {
		t.Fatalf("lookups: status %d, pooled or dense rows differ from the reference", got)
	}

	for name, bad := range map[string]shm.Request{
		"no examples":    {SlotHeader: shm.SlotHeader{Examples: 0}, Payload: r.arena[:0]},
		"over max batch": {SlotHeader: shm.SlotHeader{Examples: r.maxBatch + 1}, Payload: r.arena[:r.cfg.Request(r.maxBatch+1).Size]},
		"short":          {SlotHeader: shm.SlotHeader{Examples: n}, Payload: r.arena[:len(enc)-4]},
		"misaligned":     {SlotHeader: shm.SlotHeader{Examples: n}, Payload: r.arena[2 : len(enc)+2]},
	} {
		if _, st, _ := r.read(&bad); st != shm.StatusInvalid {
			t.Errorf("%s: status %v, want invalid", name, st)
		}
	}

	// An id outside its table fails the request at lookup, not the worker.
	copy(r.arena, enc)
	lay := r.cfg.Request(n)
	copy(r.arena[lay.SparseOffset+4*(n-1)*r.cfg.SparseWidth():], []byte{0xff, 0xff, 0xff, 0x7f})
	if _, st, b := r.read(&req); st != shm.StatusOK || b.lookupStatus() != shm.StatusInvalid {
		t.Fatalf("an id out of range: status %v, lookup status %d", st, b.lookupStatus())
	}
}

// FuzzRequestPayload feeds the embedder's request reading what a hostile
// frontend can leave behind a slot header that passed shm's checks: any
// example count, any payload bytes at any offset and length inside the
// arena. decodeRequest must accept exactly the requests whose count, size
// and alignment fit the layout; the lookups must then fail the request
// (StatusInvalid) or produce the reference's pooled rows, never panic or
// read outside the payload; and what it accepts must round-trip through
// the plain encoder.
//
//	go test -run=NONE -fuzz='^FuzzRequestPayload$' -fuzztime=10s ./embedder/
func FuzzRequestPayload(f *testing.F) {
	r := newPayloadRig(f)
	for _, n := range []int{1, 3, DefaultChunk + 1} {
		f.Add(uint16(n), uint16(0), uint16(r.cfg.Request(n).Size), r.validPayload(f, n))
	}
	f.Add(uint16(2), uint16(4), uint16(r.cfg.Request(2).Size), []byte{1, 2, 3})
	f.Add(uint16(2), uint16(1), uint16(r.cfg.Request(2).Size), r.validPayload(f, 2))
	f.Add(uint16(0), uint16(0), uint16(0), []byte{})
	f.Add(uint16(65), uint16(0), uint16(r.cfg.Request(65).Size), []byte{})
	f.Fuzz(func(t *testing.T, examples, off, length uint16, data []byte) {
		clear(r.arena)
		// shm guarantees the payload lies in the arena and nothing more.
		o := int(off) % len(r.arena)
		l := min(int(length), len(r.arena)-o)
		copy(r.arena[o:o+l], data)
		req := shm.Request{SlotHeader: shm.SlotHeader{Examples: int(examples), PayloadOffset: o, PayloadLength: l}, Payload: r.arena[o : o+l : o+l]}
		n := req.Examples
		lay := r.cfg.Request(n)
		valid := n >= 1 && n <= r.maxBatch && l == lay.Size && o%4 == 0

		p, st, b := r.read(&req)
		if (st == shm.StatusOK) != valid {
			t.Fatalf("%d examples, %d bytes at offset %d: status %v", n, l, o, st)
		}
		if !valid {
			return
		}
		ref, err := lay.DecodePayload(req.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if !sameBits(p.Dense, ref.Dense) || !slices.Equal(p.Sparse, ref.Sparse) {
			t.Fatal("the views read something else than the plain decoder")
		}
		enc := make([]byte, lay.Size)
		if err := lay.EncodePayload(enc, p); err != nil || !bytes.Equal(enc, req.Payload) {
			t.Fatalf("re-encoding the decoded request changed it (%v)", err)
		}
		want, ok := r.pool(ref.Sparse, n)
		switch got := b.lookupStatus(); {
		case !ok && got != shm.StatusInvalid:
			t.Fatalf("ids out of range: lookup status %v, want invalid", got)
		case ok && got != shm.StatusOK:
			t.Fatalf("ids in range: lookup status %v", got)
		case ok && (!slices.Equal(b.pooled, want) || !sameBits(b.dense, ref.Dense)):
			t.Fatal("pooled or dense rows differ from the reference")
		}
	})
}

// sameBits compares float32s bit for bit: payload bytes may hold NaNs,
// which == never matches.
func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// TestMergeRows: SLO mode's merge bound is the largest power of two of
// examples whose staging region fits the byte budget, within MaxBatch.
func TestMergeRows(t *testing.T) {
	cfg := model.Config{NumDense: model.NumDense, EmbeddingDim: model.EmbeddingDim, VocabSizes: make([]int, model.NumTables)}
	full := int64(cfg.Staging(1024).Size) // 13.1 MiB; 2,048 rows would take 26.1
	for _, c := range []struct {
		budget   int64
		maxBatch int
		want     int
	}{
		{DefaultSLOBatchBytes, 4096, 1024},
		{full, 4096, 1024}, // exactly full
		{full - 1, 4096, 512},
		{DefaultSLOBatchBytes, 256, 256}, // MaxBatch binds first
		{1, 4096, 1},                     // a budget below one example still merges nothing
	} {
		if got := mergeRows(cfg, Options{SLOBatchBytes: c.budget, MaxBatch: c.maxBatch}); got != c.want {
			t.Errorf("mergeRows(budget %d, max batch %d) = %d, want %d", c.budget, c.maxBatch, got, c.want)
		}
	}
}
