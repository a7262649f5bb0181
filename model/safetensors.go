package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
)

// The safetensors layout recmesh writes (and the subset it reads):
//
//	offset 0         8-byte little-endian uint64 N: the header length
//	offset 8         N bytes of JSON:
//	                   {"__metadata__": {"format": "recmesh-dlrm-v1", "seed": "1"},
//	                    "<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
//	                    ...}
//	                 padded with spaces so that 8+N is a multiple of dataAlign
//	offset 8+N       the data section; data_offsets are relative to its start
//
// Tensors are written contiguously in bundle order (tables, then dense
// parameters in execution order), with no gaps: gaps would make the file
// unreadable by the reference safetensors implementation, which requires
// data_offsets to tile the data section exactly. In an fp32 or fp16 bundle
// every tensor but the last (the final bias, one value) is a multiple of
// dataAlign bytes long, so every tensor starts dataAlign-aligned. An int8
// or int4 table is vocab×136 or vocab×68 bytes (see Dtype), so the tensors
// after it start only 8- or 4-byte aligned: enough for the float32 views
// of the dense parameters, and the embedder copies the tables into its own
// cache-line-aligned memory anyway. Half-precision dense parameters (see
// DenseDtype) need only 2-byte alignment, which every layout gives them.
const (
	// headerLenBytes is the size of the little-endian header length prefix.
	headerLenBytes = 8
	// dataAlign is the file-offset alignment of the data section: a cache
	// line, so table rows never straddle one more than they must.
	dataAlign = 64
	// maxHeaderBytes bounds the JSON header (the reference implementation
	// uses the same limit), so a corrupt length cannot make us parse GBs.
	maxHeaderBytes = 100_000_000
	// dtypeF32 is the dtype of fp32 dense parameters and fp32 tables;
	// dtypeF16 that of fp16 dense parameters and fp16 tables; dtypeBF16
	// that of bf16 dense parameters; dtypeU8 that of int8 and int4 tables,
	// whose rows are fused bytes (values, scale, bias: see Dtype).
	dtypeF32  = "F32"
	dtypeF16  = "F16"
	dtypeBF16 = "BF16"
	dtypeU8   = "U8"
	// metadataKey is the reserved header key for free-form string metadata.
	metadataKey = "__metadata__"
	// FormatName is the "format" metadata value of bundles Export writes.
	FormatName = "recmesh-dlrm-v1"
)

// tensorInfo is one tensor's header entry.
type tensorInfo struct {
	Dtype       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// placed is a tensor as model.safetensors stores it, with its byte range
// within the data section.
type placed struct {
	spec ParamSpec // the logical tensor: its name and shape in values
	// table is the precision of an embedding table ("" for a dense
	// parameter), dense that of a dense parameter ("" for a table).
	table      Dtype
	dense      DenseDtype
	dtype      string // safetensors dtype
	shape      []int  // safetensors shape
	size       int64  // bytes
	begin, end int64
}

// bundleSpecs lists every tensor of a bundle in file order: the embedding
// tables, then the dense parameters in execution order.
func bundleSpecs(cfg Config) []ParamSpec {
	return append(cfg.Tables(), cfg.DenseParams()...)
}

// storedSpecs lists every tensor of a bundle in file order as it is
// stored: the tables at cfg.TableDtype, the dense parameters at
// cfg.DenseDtype. begin and end are left 0.
func storedSpecs(cfg Config) []placed {
	specs := bundleSpecs(cfg)
	out := make([]placed, len(specs))
	for i, s := range specs {
		if i < len(cfg.VocabSizes) {
			d := cfg.TableDtype.norm()
			vocab := s.Shape[0]
			out[i] = placed{spec: s, table: d, dtype: d.tensorDtype(), shape: d.tensorShape(vocab, cfg.EmbeddingDim),
				size: int64(vocab) * int64(d.RowBytes(cfg.EmbeddingDim))}
			continue
		}
		d := cfg.DenseDtype.norm()
		out[i] = placed{spec: s, dense: d, dtype: d.tensorDtype(), shape: s.Shape, size: s.Elements() * int64(d.ValueBytes())}
	}
	return out
}

// layout places cfg's tensors back to back from offset 0 of the data
// section and returns the placements and the data section length.
func layout(cfg Config) ([]placed, int64) {
	out := storedSpecs(cfg)
	var off int64
	for i := range out {
		out[i].begin, out[i].end = off, off+out[i].size
		off += out[i].size
	}
	return out, off
}

// encodeHeader returns the 8-byte length prefix and the JSON header, padded
// with spaces so the data section starts at a multiple of dataAlign. Entries
// are written in the given order and metadata keys in the given order, so
// the bytes depend on nothing but the arguments.
func encodeHeader(tensors []placed, meta [][2]string) []byte {
	var js bytes.Buffer
	js.WriteByte('{')
	if len(meta) > 0 {
		js.WriteString(strconv.Quote(metadataKey))
		js.WriteString(":{")
		for i, kv := range meta {
			if i > 0 {
				js.WriteByte(',')
			}
			writeJSONString(&js, kv[0])
			js.WriteByte(':')
			writeJSONString(&js, kv[1])
		}
		js.WriteByte('}')
	}
	for i, t := range tensors {
		if i > 0 || len(meta) > 0 {
			js.WriteByte(',')
		}
		writeJSONString(&js, t.spec.Name)
		fmt.Fprintf(&js, `:{"dtype":%q,"shape":[`, t.dtype)
		for j, d := range t.shape {
			if j > 0 {
				js.WriteByte(',')
			}
			js.WriteString(strconv.Itoa(d))
		}
		fmt.Fprintf(&js, `],"data_offsets":[%d,%d]}`, t.begin, t.end)
	}
	js.WriteByte('}')
	for (headerLenBytes+js.Len())%dataAlign != 0 {
		js.WriteByte(' ')
	}
	out := make([]byte, headerLenBytes, headerLenBytes+js.Len())
	binary.LittleEndian.PutUint64(out, uint64(js.Len()))
	return append(out, js.Bytes()...)
}

func writeJSONString(buf *bytes.Buffer, s string) {
	b, _ := json.Marshal(s) // a string always marshals
	buf.Write(b)
}

// fileHeader is a parsed safetensors header.
type fileHeader struct {
	tensors   map[string]tensorInfo
	meta      map[string]string
	dataStart int64 // file offset of the data section
}

// parseHeader reads the header of a safetensors file whose bytes are file.
// It checks only what the format itself requires; matching the tensors
// against a Config is checkBundle's job.
func parseHeader(file []byte) (*fileHeader, error) {
	size := int64(len(file))
	if size < headerLenBytes {
		return nil, fmt.Errorf("%w: file is %d bytes, shorter than the %d-byte header length", ErrCorrupt, size, headerLenBytes)
	}
	n := binary.LittleEndian.Uint64(file)
	if n > maxHeaderBytes {
		return nil, fmt.Errorf("%w: header length %d exceeds the %d-byte limit", ErrCorrupt, n, maxHeaderBytes)
	}
	if int64(n) > size-headerLenBytes {
		return nil, fmt.Errorf("%w: header length %d runs past the end of the %d-byte file", ErrCorrupt, n, size)
	}
	raw := file[headerLenBytes : headerLenBytes+n]
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("%w: header is not a JSON object: %v", ErrCorrupt, err)
	}
	h := &fileHeader{
		tensors:   make(map[string]tensorInfo, len(entries)),
		dataStart: headerLenBytes + int64(n),
	}
	for name, msg := range entries {
		if name == metadataKey {
			if err := json.Unmarshal(msg, &h.meta); err != nil {
				return nil, fmt.Errorf("%w: %s is not a map of strings: %v", ErrCorrupt, metadataKey, err)
			}
			continue
		}
		var info tensorInfo
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&info); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: bad header entry: %v", ErrCorrupt, name, err)
		}
		if info.Dtype == "" || info.Shape == nil || info.DataOffsets == nil {
			return nil, fmt.Errorf("%w: tensor %q: header entry needs dtype, shape and data_offsets", ErrCorrupt, name)
		}
		h.tensors[name] = info
	}
	return h, nil
}
