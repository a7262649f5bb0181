package frontend

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
)

// FuzzModelInferRequest feeds arbitrary bytes, as a client could send
// them, through the request decoder. Whatever the bytes, the lean
// transport's unmarshaller must agree with proto.Unmarshal (same message,
// or an error where it fails), parse must not panic, and a request it
// accepts must hold what the backend is promised: 1..MaxBatch examples,
// finite dense features and every sparse id inside its table, copied in
// full.
func FuzzModelInferRequest(f *testing.F) {
	cfg := testConfig()
	opts, err := Options{Model: cfg, Backend: newFakeBackend(), MaxBatch: testMaxBatch}.withDefaults()
	if err != nil {
		f.Fatal(err)
	}
	sc := newSchema(opts)
	for _, n := range []int{1, 3} {
		dense, sparse := inputs(n)
		for _, int64ids := range []bool{false, true} {
			for _, req := range []*inference.ModelInferRequest{rawRequest(dense, sparse, n, int64ids), typedRequest(dense, sparse, n, int64ids)} {
				b, err := proto.Marshal(req)
				if err != nil {
					f.Fatal(err)
				}
				f.Add(b)
			}
		}
	}
	for _, b := range oddRequests(f) {
		f.Add(b)
	}
	width := cfg.SparseWidth()
	offsets := cfg.HotnessOffsets()
	dec := newRequestDecoder(sc)
	f.Fuzz(func(t *testing.T, data []byte) {
		var ref, req inference.ModelInferRequest
		refErr := proto.Unmarshal(data, &ref)
		err := dec.Unmarshal(data, &req)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("decoder error %v, proto.Unmarshal error %v", err, refErr)
		}
		if err != nil {
			return
		}
		if !proto.Equal(&req, &ref) {
			t.Fatalf("decoder gave %v, proto.Unmarshal %v", &req, &ref)
		}
		var in inferInput
		if sc.parse(&req, &in) != nil {
			return
		}
		if in.n < 1 || in.n > testMaxBatch {
			t.Fatalf("accepted %d examples", in.n)
		}
		dense := make([]float32, in.n*model.NumDense)
		sparse := make([]int32, in.n*width)
		in.dense.copyDense(dense)
		in.sparse.copySparse(sparse)
		for i, v := range dense {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("accepted dense[%d] = %v", i, v)
			}
		}
		for i, id := range sparse {
			col := i % width
			table := 0
			for table+1 < len(offsets) && offsets[table+1] <= col {
				table++
			}
			if id < 0 || int(id) >= cfg.VocabSizes[table] {
				t.Fatalf("accepted id %d in column %d (table %d of %d rows)", id, col, table, cfg.VocabSizes[table])
			}
		}
	})
}
