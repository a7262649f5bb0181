package model

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
)

// A dense-weights file is a safetensors file (the layout safetensors.go
// describes) that holds a model's dense parameters and nothing else: every
// tensor Config.DenseParams names, with the shape it gives, and no other.
// It is how new dense weights for a serving model travel (the object store
// bucket updates.DenseBucket, `recmesh update dense`): the same network
// shape, new values, no tables.
//
// WriteDenseWeights writes the values as float32 (dtype F32), whatever the
// model's dense precision. ReadDenseWeights accepts F32 tensors and, for a
// model whose dense_dtype is fp16 or bf16, tensors of that precision too
// (F16 or BF16, as the bundle stores them); the two may be mixed. The
// values are the model's new weights as DenseDtype defines them: at a half
// precision the server rounds float32 values to the nearest half, ties to
// even, exactly as Export rounds its float32 draw (DenseDtype.Stored).

// DenseWeightsFormat is the "format" metadata value of the dense-weights
// files WriteDenseWeights writes. Readers do not require it: a file from
// another safetensors writer with the right tensors is accepted.
const DenseWeightsFormat = "recmesh-dense-v1"

// denseWriteChunk is how many values WriteDenseWeights encodes per write.
const denseWriteChunk = 1 << 16

// DenseWeightsOf returns b's dense parameters by name, in float32 (see
// Bundle.Param): views that are valid until b is closed.
func DenseWeightsOf(b *Bundle) map[string][]float32 {
	specs := b.Config.DenseParams()
	out := make(map[string][]float32, len(specs))
	for _, s := range specs {
		out[s.Name] = b.Param(s.Name)
	}
	return out
}

// GenerateDenseWeights returns every dense parameter of cfg as Export
// draws it from seed, in float32 before any rounding (see GenerateTensor):
// new weights of the same network, for tests and demonstrations.
func GenerateDenseWeights(cfg Config, seed uint64) (map[string][]float32, error) {
	specs := cfg.DenseParams()
	out := make(map[string][]float32, len(specs))
	for _, s := range specs {
		v, err := GenerateTensor(cfg, seed, s.Name)
		if err != nil {
			return nil, err
		}
		out[s.Name] = v
	}
	return out, nil
}

// WriteDenseWeights writes params, every dense parameter of cfg by name
// (row-major, as Config.DenseParams shapes them), to w as a dense-weights
// file of float32 tensors in DenseParams order, and returns the bytes
// written. It refuses a parameter that is missing, has the wrong number of
// values or holds a NaN or an infinity, and a name cfg does not have,
// before writing anything.
func WriteDenseWeights(w io.Writer, cfg Config, params map[string][]float32) (int64, error) {
	specs := cfg.DenseParams()
	if err := checkDenseNames(specs, params); err != nil {
		return 0, err
	}
	places := make([]placed, len(specs))
	var off int64
	for i, s := range specs {
		v, ok := params[s.Name]
		if !ok {
			return 0, fmt.Errorf("dense weights: tensor %s is missing (model %s has %d dense tensors)", s.Name, cfg.ID(), len(specs))
		}
		if int64(len(v)) != s.Elements() {
			return 0, fmt.Errorf("dense weights: tensor %s has %d values, the model's shape %v holds %d", s.Name, len(v), s.Shape, s.Elements())
		}
		if j, x, bad := firstNonFinite(v); bad {
			return 0, fmt.Errorf("dense weights: tensor %s %w", s.Name, unstorableError(DenseFP32, j, x, x))
		}
		size := 4 * s.Elements()
		places[i] = placed{spec: s, dtype: dtypeF32, shape: s.Shape, size: size, begin: off, end: off + size}
		off += size
	}
	header := encodeHeader(places, [][2]string{{"format", DenseWeightsFormat}, {"model", cfg.ID()}})
	n, err := w.Write(header)
	written := int64(n)
	if err != nil {
		return written, fmt.Errorf("dense weights: write header: %w", err)
	}
	buf := make([]byte, 4*denseWriteChunk)
	for _, s := range specs {
		v := params[s.Name]
		for len(v) > 0 {
			k := min(len(v), denseWriteChunk)
			for j, x := range v[:k] {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(x))
			}
			n, err := w.Write(buf[:4*k])
			written += int64(n)
			if err != nil {
				return written, fmt.Errorf("dense weights: write tensor %s: %w", s.Name, err)
			}
			v = v[k:]
		}
	}
	return written, nil
}

// ReadDenseWeights reads a dense-weights file for the model cfg describes
// and returns its values by name, in float32. It checks everything a
// serving model needs before anything is swapped: every dense parameter
// cfg names is present with exactly the shape cfg gives it, no other
// tensor is, each is stored as F32 or as cfg's own dense precision, its
// data lies inside the file, and every value is finite and stays finite
// at cfg's dense precision. An error names the tensor and says what
// differs. The float32 slices may alias b (an aligned F32 tensor is read in
// place), so b must not change while they are used.
func ReadDenseWeights(cfg Config, b []byte) (map[string][]float32, error) {
	h, err := parseHeader(b)
	if err != nil {
		return nil, fmt.Errorf("dense weights: %w", err)
	}
	specs := cfg.DenseParams()
	if err := checkDenseNames(specs, h.tensors); err != nil {
		return nil, err
	}
	dd := cfg.DenseDtype.norm()
	dataLen := int64(len(b)) - h.dataStart
	out := make(map[string][]float32, len(specs))
	for _, s := range specs {
		info, ok := h.tensors[s.Name]
		if !ok {
			return nil, fmt.Errorf("dense weights: tensor %s is missing (model %s has %d dense tensors)", s.Name, cfg.ID(), len(specs))
		}
		if !sameShape(info.Shape, s.Shape) {
			return nil, fmt.Errorf("dense weights: tensor %s has shape %v, the serving model's is %v", s.Name, info.Shape, s.Shape)
		}
		var valueBytes int64
		switch {
		case info.Dtype == dtypeF32:
			valueBytes = 4
		case dd != DenseFP32 && info.Dtype == dd.tensorDtype():
			valueBytes = 2
		default:
			also := ""
			if dd != DenseFP32 {
				also = " or " + dd.tensorDtype()
			}
			return nil, fmt.Errorf("dense weights: tensor %s has dtype %s, want %s%s (the serving model's dense_dtype is %s)", s.Name, info.Dtype, dtypeF32, also, dd)
		}
		if len(info.DataOffsets) != 2 {
			return nil, fmt.Errorf("dense weights: tensor %s: %w: data_offsets %v is not [begin, end]", s.Name, ErrCorrupt, info.DataOffsets)
		}
		begin, end := info.DataOffsets[0], info.DataOffsets[1]
		if want := s.Elements() * valueBytes; begin < 0 || end < begin || end-begin != want {
			return nil, fmt.Errorf("dense weights: tensor %s: %w: data_offsets [%d, %d] hold %d bytes, shape %v of %s needs %d",
				s.Name, ErrCorrupt, begin, end, end-begin, s.Shape, info.Dtype, want)
		}
		if end > dataLen {
			return nil, fmt.Errorf("dense weights: tensor %s: %w: data_offsets end %d is past the %d-byte data section (truncated file?)",
				s.Name, ErrCorrupt, end, dataLen)
		}
		raw := b[h.dataStart+begin : h.dataStart+end : h.dataStart+end]
		var v []float32
		if valueBytes == 4 {
			v = floatView(raw)
		} else {
			v = widenAll(dd, halfView(raw))
		}
		if i, x, stored, bad := firstUnstorable(dd, v); bad {
			return nil, fmt.Errorf("dense weights: tensor %s %w", s.Name, unstorableError(dd, i, x, stored))
		}
		out[s.Name] = v
	}
	return out, nil
}

// checkDenseNames refuses a tensor name that is not one of specs'.
func checkDenseNames[V any](specs []ParamSpec, tensors map[string]V) error {
	want := make(map[string]bool, len(specs))
	for _, s := range specs {
		want[s.Name] = true
	}
	var extra []string
	for name := range tensors {
		if !want[name] {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		return fmt.Errorf("dense weights: tensor %q is not a dense parameter of the serving model (%d unexpected in all)", extra[0], len(extra))
	}
	return nil
}

// Stored returns what a bundle exported at d with the float32 weights vals
// holds for them (see DenseDtype): at fp32, vals itself and no halves; at
// fp16 and bf16, the nearest halves, ties to even, as Export rounds, and
// their widening to float32 (what Bundle.ParamBits and Bundle.Param of
// such a bundle return). It fails on a value that is not finite or whose
// half is not (a float32 beyond fp16's range), naming the element.
func (d DenseDtype) Stored(vals []float32) (values []float32, halves []uint16, err error) {
	d = d.norm()
	if d == DenseFP32 {
		if i, x, bad := firstNonFinite(vals); bad {
			return nil, nil, unstorableError(d, i, x, x)
		}
		return vals, nil, nil
	}
	values = make([]float32, len(vals))
	halves = make([]uint16, len(vals))
	for i, v := range vals {
		h := d.narrow(v)
		w := d.widen(h)
		if w-w != 0 { // NaN or infinite: v was, or its half is
			return nil, nil, unstorableError(d, i, v, w)
		}
		halves[i], values[i] = h, w
	}
	return values, halves, nil
}

// firstUnstorable finds the first value of vals that is not finite or
// whose rounding to d is not, and what d stores it as.
func firstUnstorable(d DenseDtype, vals []float32) (i int, v, stored float32, bad bool) {
	if d.norm() == DenseFP32 {
		i, v, bad := firstNonFinite(vals)
		return i, v, v, bad
	}
	for i, v := range vals {
		if w := d.widen(d.narrow(v)); w-w != 0 {
			return i, v, w, true
		}
	}
	return 0, 0, 0, false
}

// unstorableError says that element i, v, cannot be a weight at d, which
// stores it as stored.
func unstorableError(d DenseDtype, i int, v, stored float32) error {
	if v-v != 0 {
		return fmt.Errorf("element %d is %v", i, v)
	}
	return fmt.Errorf("element %d is %v, which %s stores as %v", i, v, d, stored)
}
