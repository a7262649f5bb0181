package model

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Bundle file names inside a bundle directory.
const (
	ConfigFile  = "config.json"
	WeightsFile = "model.safetensors"
)

// Bundle is an open weights bundle: config.json parsed and validated, and
// model.safetensors mapped read-only and shared, so every process that opens
// the same bundle shares one copy in the page cache.
//
// Slices returned by Tensor, Table, TableData, Param and ParamBits are
// views into the mapping: they are read-only (a write faults) and valid
// only until Close. The exception is the dense parameters of a bundle
// whose dense_dtype is fp16 or bf16: Tensor and Param return them widened
// to float32, which Open does once, into the heap (the MLPerf network is
// 64 MB in float32), since every user but a half-precision kernel wants
// float32 and should not widen 16 million values per call. They are
// read-only all the same. The methods other than Close are safe for
// concurrent use; Close must wait until every user of the bundle and its
// views is done.
type Bundle struct {
	// Config is the bundle's config.json.
	Config Config
	// Dir is the directory the bundle was opened from.
	Dir string

	path    string               // model.safetensors, for ReleaseTable's fadvise
	mapping []byte               // the whole of model.safetensors; nil once closed
	tensors map[string][]float32 // every float32 tensor (the dense ones widened), by name
	halves  map[string][]uint16  // the stored dense parameters at fp16 and bf16, by name
	tables  [][]byte             // every table's stored rows, by index
	meta    map[string]string    // the header's __metadata__ (may be nil)
}

// Open maps dir/model.safetensors read-only (mmap, MAP_SHARED, PROT_READ)
// and validates it against dir/config.json: every tensor the config names
// must be present with the dtype, shape and byte size its precision gives
// (dense parameters as config.json's dense_dtype stores them, see
// DenseDtype; tables as its table_dtype stores them, see Dtype), with data
// inside the file; no other tensor may be present, tensors may not
// overlap, and the dense parameters must be finite. Tensors may be stored
// in any order, with or without gaps; one whose data is not aligned to its
// values in the file is copied to the heap, so a bundle written by another
// safetensors writer still opens. Half-precision dense parameters are also
// widened into the heap (see Bundle); nothing else is copied.
func Open(dir string) (*Bundle, error) {
	b, err := open(dir)
	if err != nil {
		return nil, fmt.Errorf("model: open bundle %s: %w", dir, err)
	}
	return b, nil
}

func open(dir string) (*Bundle, error) {
	cfg, err := readConfig(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, WeightsFile)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping outlives the descriptor
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	if size < headerLenBytes {
		return nil, fmt.Errorf("%s: %w: file is %d bytes, shorter than the %d-byte header length", WeightsFile, ErrCorrupt, size, headerLenBytes)
	}
	if size != int64(int(size)) {
		return nil, fmt.Errorf("%s: %d bytes do not fit this address space", WeightsFile, size)
	}
	mapping, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", WeightsFile, err)
	}
	b := &Bundle{Config: cfg, Dir: dir, path: path, mapping: mapping}
	if err := b.load(); err != nil {
		unix.Munmap(mapping)
		return nil, fmt.Errorf("%s: %w", WeightsFile, err)
	}
	return b, nil
}

// readConfig reads and validates config.json.
func readConfig(path string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var cfg Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return Config{}, fmt.Errorf("%s: %w: not a model config: %v", ConfigFile, ErrCorrupt, err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", ConfigFile, err)
	}
	cfg.TableDtype = cfg.TableDtype.norm()
	cfg.DenseDtype = cfg.DenseDtype.norm()
	return cfg, nil
}

// load parses the mapped file's header, checks it against b.Config and
// builds the tensor views.
func (b *Bundle) load() error {
	h, err := parseHeader(b.mapping)
	if err != nil {
		return err
	}
	b.meta = h.meta
	if err := checkSeed(b.Config, h.meta); err != nil {
		return err
	}
	places, err := checkTensors(b.Config, h, int64(len(b.mapping)))
	if err != nil {
		return err
	}
	b.tensors = make(map[string][]float32, len(places))
	if b.Config.DenseDtype != DenseFP32 {
		b.halves = make(map[string][]uint16, len(places))
	}
	for _, p := range places {
		raw := b.mapping[h.dataStart+p.begin : h.dataStart+p.end : h.dataStart+p.end]
		switch {
		case p.table != "":
			b.tables = append(b.tables, raw)
			if p.dtype == dtypeF32 {
				b.tensors[p.spec.Name] = floatView(raw)
			}
		case p.dense == DenseFP32:
			b.tensors[p.spec.Name] = floatView(raw)
		default:
			hv := halfView(raw)
			b.halves[p.spec.Name] = hv
			b.tensors[p.spec.Name] = widenAll(p.dense, hv)
		}
	}
	// Tables are too big to scan on every open; the dense parameters are a
	// few tens of MB and a NaN there would poison every score. A stored
	// half is NaN or infinite exactly when its widening is.
	for _, s := range b.Config.DenseParams() {
		if i, v, ok := firstNonFinite(b.tensors[s.Name]); ok {
			return fmt.Errorf("%w: tensor %q: element %d is %v", ErrCorrupt, s.Name, i, v)
		}
	}
	return nil
}

// checkSeed refuses a model.safetensors exported with another seed than the
// config.json beside it says: the shapes would match, the weights would not.
// Files from other writers carry no recmesh metadata and are not checked.
func checkSeed(cfg Config, meta map[string]string) error {
	if meta["format"] != FormatName {
		return nil
	}
	s, ok := meta["seed"]
	if !ok {
		return nil
	}
	seed, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: metadata seed %q is not a number", ErrCorrupt, s)
	}
	if seed != cfg.Seed {
		return fmt.Errorf("%w: weights were exported with seed %d, %s says seed %d", ErrMismatch, seed, ConfigFile, cfg.Seed)
	}
	return nil
}

// checkTensors matches the header against cfg's tensors and returns each
// one's byte range in the data section, in bundle order.
func checkTensors(cfg Config, h *fileHeader, fileSize int64) ([]placed, error) {
	specs := storedSpecs(cfg)
	want := make(map[string]bool, len(specs))
	for _, s := range specs {
		want[s.spec.Name] = true
	}
	var extra []string
	for name := range h.tensors {
		if !want[name] {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		return nil, fmt.Errorf("%w: unexpected tensor %q (not in %s; %d unexpected in all)", ErrMismatch, extra[0], ConfigFile, len(extra))
	}
	dataLen := fileSize - h.dataStart
	places := make([]placed, len(specs))
	for i, s := range specs {
		name := s.spec.Name
		info, ok := h.tensors[name]
		if !ok {
			return nil, fmt.Errorf("%w: tensor %q is missing", ErrMismatch, name)
		}
		// A table's dtype and shape follow from config.json's table_dtype,
		// a dense parameter's dtype (not its shape) from its dense_dtype:
		// say so, since that is the likelier mistake than the tensor.
		of, shapeOf := fmt.Sprintf(" (%s says dense_dtype %s)", ConfigFile, s.dense), ""
		if s.table != "" {
			of = fmt.Sprintf(" (%s says table_dtype %s)", ConfigFile, s.table)
			shapeOf = of
		}
		if info.Dtype != s.dtype {
			return nil, fmt.Errorf("%w: tensor %q has dtype %s, want %s%s", ErrMismatch, name, info.Dtype, s.dtype, of)
		}
		if !sameShape(info.Shape, s.shape) {
			return nil, fmt.Errorf("%w: tensor %q has shape %v, want %v%s", ErrMismatch, name, info.Shape, s.shape, shapeOf)
		}
		if len(info.DataOffsets) != 2 {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets %v is not [begin, end]", ErrCorrupt, name, info.DataOffsets)
		}
		begin, end := info.DataOffsets[0], info.DataOffsets[1]
		if begin < 0 || end < begin || end-begin != s.size {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] hold %d bytes, shape %v of %s needs %d%s",
				ErrCorrupt, name, begin, end, end-begin, s.shape, s.dtype, s.size, of)
		}
		if end > dataLen {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets end %d is past the %d-byte data section (truncated file?)",
				ErrCorrupt, name, end, dataLen)
		}
		s.begin, s.end = begin, end
		places[i] = s
	}
	byOffset := slices.Clone(places)
	slices.SortFunc(byOffset, func(a, b placed) int { return cmp.Compare(a.begin, b.begin) })
	for i := 1; i < len(byOffset); i++ {
		prev, cur := byOffset[i-1], byOffset[i]
		if cur.begin < prev.end {
			return nil, fmt.Errorf("%w: tensor %q [%d, %d) overlaps tensor %q [%d, %d)",
				ErrCorrupt, cur.spec.Name, cur.begin, cur.end, prev.spec.Name, prev.begin, prev.end)
		}
	}
	return places, nil
}

func sameShape(got []int64, want []int) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != int64(want[i]) {
			return false
		}
	}
	return true
}

// littleEndian reports whether this machine stores float32 as safetensors
// does, so a mapped tensor can be read in place.
func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// floatView returns raw (little-endian float32s) as a []float32: a view into
// the mapping when raw is 4-byte aligned, else (a file from a writer that
// does not align, or a big-endian machine) a decoded heap copy.
func floatView(raw []byte) []float32 {
	n := len(raw) / 4
	if n == 0 {
		return []float32{}
	}
	if littleEndian() && uintptr(unsafe.Pointer(&raw[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), n)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
	}
	return out
}

// halfView returns raw (little-endian 16-bit halves) as a []uint16: a view
// into the mapping when raw is 2-byte aligned, else (a file from a writer
// that does not align, or a big-endian machine) a decoded heap copy.
func halfView(raw []byte) []uint16 {
	n := len(raw) / 2
	if n == 0 {
		return []uint16{}
	}
	if littleEndian() && uintptr(unsafe.Pointer(&raw[0]))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&raw[0])), n)
	}
	out := make([]uint16, n)
	for i := range out {
		out[i] = uint16(raw[2*i]) | uint16(raw[2*i+1])<<8
	}
	return out
}

// widenAll returns the float32 values of the halves h stored at d.
func widenAll(d DenseDtype, h []uint16) []float32 {
	out := make([]float32, len(h))
	for i, v := range h {
		out[i] = d.widen(v)
	}
	return out
}

func firstNonFinite(v []float32) (int, float32, bool) {
	for i, x := range v {
		// x-x is NaN exactly when x is NaN or ±Inf.
		if x-x != 0 {
			return i, x, true
		}
	}
	return 0, 0, false
}

// Close unmaps the weights. Views returned earlier must not be used after
// it. Closing twice is a no-op.
func (b *Bundle) Close() error {
	if b.mapping == nil {
		return nil
	}
	m := b.mapping
	b.mapping, b.tensors, b.halves, b.tables = nil, nil, nil, nil
	if err := unix.Munmap(m); err != nil {
		return fmt.Errorf("model: close bundle %s: %w", b.Dir, err)
	}
	return nil
}

// Tensor returns the named float32 tensor: a zero-copy view into the
// mapping, or for the dense parameters of a half-precision bundle their
// values widened to float32 (see Bundle). The tables of a bundle that is
// not fp32 are not float32: for them it returns an error wrapping
// ErrNotFloat32 (read them with TableData).
func (b *Bundle) Tensor(name string) ([]float32, error) {
	if b.mapping == nil {
		return nil, fmt.Errorf("model: tensor %q: %w", name, ErrClosed)
	}
	t, ok := b.tensors[name]
	if !ok {
		if d := b.Config.TableDtype; d.norm() != DtypeFP32 && slices.ContainsFunc(b.Config.Tables(), func(s ParamSpec) bool { return s.Name == name }) {
			return nil, fmt.Errorf("model: tensor %q: %w: bundle %s stores its tables as %s rows", name, ErrNotFloat32, b.Dir, d)
		}
		return nil, fmt.Errorf("model: tensor %q: %w in bundle %s", name, ErrNoTensor, b.Dir)
	}
	return t[:len(t):len(t)], nil
}

// Table returns embedding table i of an fp32 bundle, row-major
// [vocab_i, dim]. It panics if i is not a table index, the tables are not
// fp32 or the bundle is closed (programmer errors); TableData reads a table
// at any precision.
func (b *Bundle) Table(i int) []float32 {
	return b.mustTensor(TableName(i))
}

// TableData returns embedding table i as stored: vocab_i rows of
// Config.TableDtype.RowBytes(dim) bytes each, laid out as Dtype describes,
// a zero-copy view into the mapping. It panics if i is not a table index
// or the bundle is closed (programmer errors).
func (b *Bundle) TableData(i int) []byte {
	t, err := b.tableData(i)
	if err != nil {
		panic(err)
	}
	return t
}

func (b *Bundle) tableData(i int) ([]byte, error) {
	if b.mapping == nil {
		return nil, fmt.Errorf("model: table %d: %w", i, ErrClosed)
	}
	if i < 0 || i >= len(b.tables) {
		return nil, fmt.Errorf("model: table %d: %w in bundle %s (it has %d tables)", i, ErrNoTensor, b.Dir, len(b.tables))
	}
	return b.tables[i], nil
}

// Param returns the named dense parameter (see Config.DenseParams) in
// float32, its values at any dense precision (see DenseDtype). It panics
// if the name is unknown or the bundle is closed (programmer errors); use
// Tensor for names that come from input.
func (b *Bundle) Param(name string) []float32 {
	return b.mustTensor(name)
}

// ParamBits returns the named dense parameter as a bundle whose dense_dtype
// is fp16 or bf16 stores it: one binary16 or bfloat16 bit pattern per
// value (see DenseDtype; Config.DenseDtype says which), in the shape
// Config.DenseParams gives, for a kernel that computes in half precision
// to upload as is. It is a read-only view into the mapping (a heap copy if
// the file does not align it) and nil for an fp32 bundle, whose Param is
// already what is stored. It panics if the name is not a dense parameter
// or the bundle is closed (programmer errors).
func (b *Bundle) ParamBits(name string) []uint16 {
	if b.mapping == nil {
		panic(fmt.Errorf("model: param %q: %w", name, ErrClosed))
	}
	if h, ok := b.halves[name]; ok {
		return h[:len(h):len(h)]
	}
	if b.Config.DenseDtype == DenseFP32 && slices.ContainsFunc(b.Config.DenseParams(), func(s ParamSpec) bool { return s.Name == name }) {
		return nil
	}
	panic(fmt.Errorf("model: param %q: %w in bundle %s (dense parameters are named by Config.DenseParams)", name, ErrNoTensor, b.Dir))
}

func (b *Bundle) mustTensor(name string) []float32 {
	t, err := b.Tensor(name)
	if err != nil {
		panic(err)
	}
	return t
}

// Metadata returns a copy of the safetensors __metadata__ map (nil when the
// file has none). Export writes "format" and "seed".
func (b *Bundle) Metadata() map[string]string {
	return maps.Clone(b.meta)
}

// Advise applies madvise(2) advice (for example unix.MADV_SEQUENTIAL before
// a bulk copy, unix.MADV_DONTNEED after it to drop the pages) to the whole
// mapping.
func (b *Bundle) Advise(advice int) error {
	if b.mapping == nil {
		return fmt.Errorf("model: advise bundle %s: %w", b.Dir, ErrClosed)
	}
	if err := unix.Madvise(b.mapping, advice); err != nil {
		return fmt.Errorf("model: advise bundle %s: madvise %d: %w", b.Dir, advice, err)
	}
	return nil
}

// ReleaseTable drops table i's pages from this mapping and then from the
// page cache, so a caller that copies the tables out one by one (the
// embedder) never holds the file's copy of more than one table beside its
// own: a bundle larger than half of the machine's memory then loads
// without reclaim having to find the space. Pages another process maps
// stay cached (fadvise only drops unmapped clean pages); the table must not
// be read through this bundle afterwards, though reading it is still safe
// (the pages come back from the file).
func (b *Bundle) ReleaseTable(i int) error {
	t, err := b.tableData(i)
	if err != nil {
		return err
	}
	if len(t) == 0 {
		return nil
	}
	// madvise needs a page-aligned start; the partial pages at either end
	// are shared with neighbouring tensors and are left alone.
	page := uintptr(os.Getpagesize())
	base := uintptr(unsafe.Pointer(&b.mapping[0]))
	start := uintptr(unsafe.Pointer(&t[0])) - base
	end := start + uintptr(len(t))
	alignedStart := (start + page - 1) &^ (page - 1)
	alignedEnd := end &^ (page - 1)
	if alignedEnd <= alignedStart {
		return nil
	}
	if err := unix.Madvise(b.mapping[alignedStart:alignedEnd], unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("model: release table %d of %s: madvise: %w", i, b.Dir, err)
	}
	f, err := os.Open(b.path)
	if err != nil {
		return fmt.Errorf("model: release table %d of %s: %w", i, b.Dir, err)
	}
	defer f.Close()
	if err := dropCached(f, int64(alignedStart), int64(alignedEnd-alignedStart)); err != nil {
		return fmt.Errorf("model: release table %d of %s: fadvise: %w", i, b.Dir, err)
	}
	return nil
}

// ReadConfig reads and validates dir's config.json without mapping the
// weights: enough to size a bundle before loading it.
func ReadConfig(dir string) (Config, error) {
	cfg, err := readConfig(filepath.Join(dir, ConfigFile))
	if err != nil {
		return Config{}, fmt.Errorf("model: bundle %s: %w", dir, err)
	}
	return cfg, nil
}
