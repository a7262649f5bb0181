package model

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// exportDev writes the small default bundle (about 75 MB, a tenth of a
// second) into a fresh temporary directory.
func exportDev(t testing.TB, seed uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := Export(context.Background(), dir, DLRMv2(DevVocabCap), seed, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

func openT(t testing.TB, dir string) *Bundle {
	t.Helper()
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestExportRoundTrip(t *testing.T) {
	var calls int
	var last, total int64
	dir := filepath.Join(t.TempDir(), "bundle")
	err := Export(context.Background(), dir, DLRMv2(DevVocabCap), 7, func(done, tot int64) {
		if done < last || (total != 0 && tot != total) {
			t.Errorf("progress went from %d/%d to %d/%d", last, total, done, tot)
		}
		calls++
		last, total = done, tot
	})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, WeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	if calls < 2 || last != total || total != fi.Size() {
		t.Errorf("progress: %d calls, last %d/%d, file is %d bytes", calls, last, total, fi.Size())
	}

	b := openT(t, dir)
	want := DLRMv2(DevVocabCap)
	want.Seed = 7
	if got, _ := json.Marshal(b.Config); !bytes.Equal(got, mustJSON(t, want)) {
		t.Errorf("config = %s, want %s", got, mustJSON(t, want))
	}
	if m := b.Metadata(); m["format"] != FormatName || m["seed"] != "7" {
		t.Errorf("metadata = %v", m)
	}
	// Every tensor holds exactly what the generator gives for its index.
	for i, s := range bundleSpecs(b.Config) {
		got, err := b.Tensor(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		wantVals := make([]float32, s.Elements())
		newStream(7, domainWeights, uint64(i)).uniformFill(wantVals, 0, initBound(s))
		if !slices.Equal(got, wantVals) {
			t.Fatalf("tensor %s differs from a regeneration", s.Name)
		}
		bound := float32(initBound(s))
		if lo, hi := slices.Min(got), slices.Max(got); lo < -bound || hi >= bound || (lo == hi && len(got) > 1) {
			t.Errorf("tensor %s spans [%g, %g], want inside [-%g, %g)", s.Name, lo, hi, bound, bound)
		}
	}
	if got := b.Table(3); len(got) != b.Config.VocabSizes[3]*EmbeddingDim {
		t.Errorf("Table(3) has %d values", len(got))
	}
	if got := b.Param("top_mlp.4.bias"); len(got) != 1 {
		t.Errorf("Param(top_mlp.4.bias) has %d values", len(got))
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestExportDeterministic(t *testing.T) {
	read := func(dir string) ([]byte, []byte) {
		w, err := os.ReadFile(filepath.Join(dir, WeightsFile))
		if err != nil {
			t.Fatal(err)
		}
		c, err := os.ReadFile(filepath.Join(dir, ConfigFile))
		if err != nil {
			t.Fatal(err)
		}
		return w, c
	}
	w1, c1 := read(exportDev(t, 1))
	w2, c2 := read(exportDev(t, 1))
	if !bytes.Equal(w1, w2) || !bytes.Equal(c1, c2) {
		t.Fatal("two exports with seed 1 differ")
	}
	w3, c3 := read(exportDev(t, 2))
	if bytes.Equal(c1, c3) || len(w1) != len(w3) {
		t.Fatalf("seed 2 config equal or size differs: %d vs %d bytes", len(w1), len(w3))
	}
	// Past the header (which differs only in the seed) no tensor may be
	// left equal: compare the data sections in 4 KiB blocks.
	start := int(binary.LittleEndian.Uint64(w1)) + headerLenBytes
	for off := start; off < len(w1); off += 4096 {
		end := min(off+4096, len(w1))
		if bytes.Equal(w1[off:end], w3[off:end]) {
			t.Fatalf("seeds 1 and 2 give equal bytes at [%d, %d)", off, end)
		}
	}
}

// TestExportGolden pins the bytes of the default bundle. Every parity
// fixture and cached bundle depends on them: if a change to the generator,
// the scales or the layout is deliberate, update the hash and say so.
func TestExportGolden(t *testing.T) {
	const want = "f75107e9b772399f5c397a95619040e2c6b9c00b86788ab84272de17d7e50b39"
	w, err := os.ReadFile(filepath.Join(exportDev(t, 1), WeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%x", sha256.Sum256(w)); got != want {
		t.Errorf("cap-%d seed-1 %s has sha256 %s, want %s", DevVocabCap, WeightsFile, got, want)
	}
}

func TestExportLayout(t *testing.T) {
	b := openT(t, exportDev(t, 1))
	h, err := parseHeader(b.mapping)
	if err != nil {
		t.Fatal(err)
	}
	if h.dataStart%dataAlign != 0 {
		t.Errorf("data section starts at %d, not %d-aligned", h.dataStart, dataAlign)
	}
	// Tables first, then dense params, back to back; every start aligned.
	var off int64
	for _, s := range bundleSpecs(b.Config) {
		info := h.tensors[s.Name]
		if info.DataOffsets[0] != off {
			t.Fatalf("tensor %s starts at %d, want %d", s.Name, info.DataOffsets[0], off)
		}
		if (h.dataStart+off)%dataAlign != 0 {
			t.Errorf("tensor %s starts at file offset %d, not %d-aligned", s.Name, h.dataStart+off, dataAlign)
		}
		off = info.DataOffsets[1]
	}
	if h.dataStart+off != int64(len(b.mapping)) {
		t.Errorf("tensors end at %d, file is %d bytes", h.dataStart+off, len(b.mapping))
	}
	// Zero copy: views point into the mapping.
	lo := uintptr(unsafe.Pointer(&b.mapping[0]))
	p := uintptr(unsafe.Pointer(&b.Table(0)[0]))
	if p < lo || p >= lo+uintptr(len(b.mapping)) {
		t.Error("Table(0) is not a view into the mapping")
	}
}

func TestExportReplacesOnlyBundles(t *testing.T) {
	dir := exportDev(t, 1)
	if err := Export(context.Background(), dir, DLRMv2(DevVocabCap), 3, nil); err != nil {
		t.Fatalf("re-export over a bundle: %v", err)
	}
	if b := openT(t, dir); b.Config.Seed != 3 {
		t.Errorf("after re-export seed = %d, want 3", b.Config.Seed)
	}
	entries, _ := os.ReadDir(filepath.Dir(dir))
	if len(entries) != 1 {
		t.Errorf("export left %d entries beside the bundle", len(entries)-1)
	}

	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "notes.txt"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Export(context.Background(), other, DLRMv2(DevVocabCap), 1, nil)
	if err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("export over a directory with other files: %v", err)
	}
}

func TestExportCanceled(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cancelAt  int64 // bytes done when progress cancels; 0 cancels before Export
		wantCalls bool
	}{{"before", 0, false}, {"midway", 20 << 20, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancelAt == 0 {
				cancel()
			}
			var calls int
			parent := t.TempDir()
			err := Export(ctx, filepath.Join(parent, "b"), DLRMv2(DevVocabCap), 1, func(done, total int64) {
				calls++
				if done >= tc.cancelAt {
					cancel()
				}
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("canceled export: %v", err)
			}
			if (calls > 0) != tc.wantCalls {
				t.Errorf("progress called %d times", calls)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Errorf("canceled export left %v", entries[0].Name())
			}
		})
	}
}

func TestExportRefusesBadConfig(t *testing.T) {
	cfg := DLRMv2(DevVocabCap)
	cfg.CrossRank = 0
	err := Export(context.Background(), filepath.Join(t.TempDir(), "b"), cfg, 1, nil)
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("export of an invalid config: %v", err)
	}
}

// rawBundle is a bundle taken apart so a test can corrupt any piece of it
// and write it back.
type rawBundle struct {
	config []byte
	header map[string]any
	data   []byte
}

func readRaw(t *testing.T, dir string) rawBundle {
	t.Helper()
	cfg, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(filepath.Join(dir, WeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(file)
	var h map[string]any
	if err := json.Unmarshal(file[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	return rawBundle{config: cfg, header: h, data: file[8+n:]}
}

// tensor returns a header entry for editing.
func (r rawBundle) tensor(name string) map[string]any { return r.header[name].(map[string]any) }

// offsets returns a tensor's data_offsets.
func (r rawBundle) offsets(name string) (int, int) {
	o := r.tensor(name)["data_offsets"].([]any)
	return int(o[0].(float64)), int(o[1].(float64))
}

// weights encodes the safetensors file with the header padded by pad
// spaces.
func (r rawBundle) weights(t *testing.T, pad int) []byte {
	t.Helper()
	js := append(mustJSON(t, r.header), bytes.Repeat([]byte(" "), pad)...)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	out = append(out, js...)
	return append(out, r.data...)
}

func writeBundle(t *testing.T, config, weights []byte) string {
	t.Helper()
	dir := t.TempDir()
	if config != nil {
		if err := os.WriteFile(filepath.Join(dir, ConfigFile), config, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if weights != nil {
		if err := os.WriteFile(filepath.Join(dir, WeightsFile), weights, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestOpenRefusesCorruptBundles(t *testing.T) {
	src := exportDev(t, 1)
	cases := []struct {
		name string
		// edit corrupts a fresh copy; it returns the config.json and
		// model.safetensors bytes to write (nil: leave the file out).
		edit func(r rawBundle) (config, weights []byte)
		want error    // sentinel the error must wrap
		msg  []string // substrings the message must hold
	}{
		{
			name: "missing config.json",
			edit: func(r rawBundle) ([]byte, []byte) { return nil, r.weights(t, 0) },
			want: fs.ErrNotExist, msg: []string{ConfigFile},
		},
		{
			name: "config.json not JSON",
			edit: func(r rawBundle) ([]byte, []byte) { return []byte("{nope"), r.weights(t, 0) },
			want: ErrCorrupt, msg: []string{ConfigFile},
		},
		{
			name: "config fails Validate",
			edit: func(r rawBundle) ([]byte, []byte) {
				return bytes.Replace(r.config, []byte(`"num_dense": 13`), []byte(`"num_dense": 12`), 1), r.weights(t, 0)
			},
			want: ErrInvalidConfig, msg: []string{ConfigFile, "num_dense is 12"},
		},
		{
			name: "config shape disagrees with the weights",
			edit: func(r rawBundle) ([]byte, []byte) {
				return bytes.Replace(r.config, []byte(`"cross_rank": 512`), []byte(`"cross_rank": 8`), 1), r.weights(t, 0)
			},
			want: ErrMismatch, msg: []string{`"cross.0.v" has shape [3456 512], want [3456 8]`},
		},
		{
			name: "missing model.safetensors",
			edit: func(r rawBundle) ([]byte, []byte) { return r.config, nil },
			want: fs.ErrNotExist, msg: []string{WeightsFile},
		},
		{
			name: "shorter than 8 bytes",
			edit: func(r rawBundle) ([]byte, []byte) { return r.config, []byte{1, 2, 3} },
			want: ErrCorrupt, msg: []string{"3 bytes", "shorter"},
		},
		{
			name: "header length beyond file",
			edit: func(r rawBundle) ([]byte, []byte) {
				w := r.weights(t, 0)[:1000]
				return r.config, w
			},
			want: ErrCorrupt, msg: []string{"header length", "past the end of the 1000-byte file"},
		},
		{
			name: "header not JSON",
			edit: func(r rawBundle) ([]byte, []byte) {
				w := r.weights(t, 0)
				w[8] = '['
				return r.config, w
			},
			want: ErrCorrupt, msg: []string{"header is not a JSON object"},
		},
		{
			name: "metadata not strings",
			edit: func(r rawBundle) ([]byte, []byte) {
				r.header[metadataKey] = map[string]any{"seed": 1}
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{metadataKey},
		},
		{
			name: "tensor missing",
			edit: func(r rawBundle) ([]byte, []byte) {
				delete(r.header, "cross.1.u")
				return r.config, r.weights(t, 0)
			},
			want: ErrMismatch, msg: []string{`"cross.1.u" is missing`},
		},
		{
			name: "extra tensor",
			edit: func(r rawBundle) ([]byte, []byte) {
				r.header["bogus.weight"] = map[string]any{"dtype": "F32", "shape": []int{1}, "data_offsets": []int{0, 4}}
				return r.config, r.weights(t, 0)
			},
			want: ErrMismatch, msg: []string{`unexpected tensor "bogus.weight"`},
		},
		{
			name: "wrong dtype",
			edit: func(r rawBundle) ([]byte, []byte) {
				r.tensor("top_mlp.0.bias")["dtype"] = "F16"
				return r.config, r.weights(t, 0)
			},
			want: ErrMismatch, msg: []string{`"top_mlp.0.bias" has dtype F16, want F32`},
		},
		{
			name: "wrong shape",
			edit: func(r rawBundle) ([]byte, []byte) {
				r.tensor("embedding.3.weight")["shape"] = []int{999, 128}
				return r.config, r.weights(t, 0)
			},
			want: ErrMismatch, msg: []string{`"embedding.3.weight" has shape [999 128], want [1000 128]`},
		},
		{
			name: "data_offsets disagree with shape",
			edit: func(r rawBundle) ([]byte, []byte) {
				b, e := r.offsets("top_mlp.1.kernel")
				r.tensor("top_mlp.1.kernel")["data_offsets"] = []int{b, e - 4}
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"top_mlp.1.kernel": data_offsets`, "needs 4194304"},
		},
		{
			name: "data_offsets not a pair",
			edit: func(r rawBundle) ([]byte, []byte) {
				r.tensor("cross.0.bias")["data_offsets"] = []int{0}
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"cross.0.bias": data_offsets [0] is not [begin, end]`},
		},
		{
			name: "truncated file",
			edit: func(r rawBundle) ([]byte, []byte) {
				w := r.weights(t, 0)
				return r.config, w[:len(w)-1000]
			},
			want: ErrCorrupt, msg: []string{`"top_mlp.4.kernel"`, "truncated"},
		},
		{
			name: "overlapping tensors",
			edit: func(r rawBundle) ([]byte, []byte) {
				// Table 5 has 3 rows, table 8 has 63: point 5 into 8.
				b, _ := r.offsets("embedding.8.weight")
				r.tensor("embedding.5.weight")["data_offsets"] = []int{b + 512, b + 512 + 3*512}
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"embedding.5.weight"`, `overlaps tensor "embedding.8.weight"`},
		},
		{
			name: "NaN in a dense param",
			edit: func(r rawBundle) ([]byte, []byte) {
				b, _ := r.offsets("top_mlp.2.bias")
				binary.LittleEndian.PutUint32(r.data[b+4*5:], math.Float32bits(float32(math.NaN())))
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"top_mlp.2.bias": element 5 is NaN`},
		},
		{
			name: "Inf in a dense param",
			edit: func(r rawBundle) ([]byte, []byte) {
				b, _ := r.offsets("cross.2.u")
				binary.LittleEndian.PutUint32(r.data[b:], math.Float32bits(float32(math.Inf(-1))))
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"cross.2.u": element 0 is -Inf`},
		},
		{
			name: "weights from another seed",
			edit: func(r rawBundle) ([]byte, []byte) {
				return bytes.Replace(r.config, []byte(`"seed": 1`), []byte(`"seed": 2`), 1), r.weights(t, 0)
			},
			want: ErrMismatch, msg: []string{"exported with seed 1", "seed 2"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, w := tc.edit(readRaw(t, src))
			dir := writeBundle(t, cfg, w)
			b, err := Open(dir)
			if err == nil {
				b.Close()
				t.Fatal("Open accepted the bundle")
			}
			t.Log(err)
			if !errors.Is(err, tc.want) {
				t.Errorf("error %q does not wrap %q", err, tc.want)
			}
			for _, m := range append(tc.msg, "model: open bundle "+dir) {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

// TestOpenForeignLayout reads bundles laid out the way the Python
// safetensors library writes them: tensors sorted by name, no metadata, the
// header padded to 8 bytes only, and, in the second case, the data section
// starting off a 4-byte boundary so every tensor must be copied.
func TestOpenForeignLayout(t *testing.T) {
	src := exportDev(t, 1)
	ref := openT(t, src)
	for _, tc := range []struct {
		name     string
		misalign int // bytes added to the 8-aligned data start
	}{{"aligned", 0}, {"misaligned", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			r := readRaw(t, src)
			delete(r.header, metadataKey)
			names := make([]string, 0, len(r.header))
			for n := range r.header {
				names = append(names, n)
			}
			slices.Sort(names)
			var data []byte
			for _, n := range names {
				b, e := r.offsets(n)
				r.tensor(n)["data_offsets"] = []int{len(data), len(data) + e - b}
				data = append(data, r.data[b:e]...)
			}
			r.data = data
			hlen := len(mustJSON(t, r.header))
			pad := (8-(8+hlen)%8)%8 + tc.misalign
			dir := writeBundle(t, r.config, r.weights(t, pad))

			b := openT(t, dir)
			lo := uintptr(unsafe.Pointer(&b.mapping[0]))
			for _, s := range bundleSpecs(b.Config) {
				got, want := b.Param(s.Name), ref.Param(s.Name)
				if !slices.Equal(got, want) {
					t.Fatalf("tensor %s differs from the original", s.Name)
				}
				p := uintptr(unsafe.Pointer(&got[0]))
				inMapping := p >= lo && p < lo+uintptr(len(b.mapping))
				if inMapping != (tc.misalign == 0) {
					t.Fatalf("tensor %s: view into the mapping = %v", s.Name, inMapping)
				}
			}
		})
	}
}

func TestBundleAccessors(t *testing.T) {
	b, err := Open(exportDev(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Tensor("nope"); !errors.Is(err, ErrNoTensor) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Tensor(nope) = %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Param(nope) did not panic")
			}
		}()
		b.Param("nope")
	}()
	// The view is capped, so an append cannot run into the next tensor.
	if v := b.Table(0); cap(v) != len(v) {
		t.Errorf("Table(0) has cap %d > len %d", cap(v), len(v))
	}
	if err := b.Advise(unix.MADV_SEQUENTIAL); err != nil {
		t.Error(err)
	}
	if err := b.Advise(unix.MADV_DONTNEED); err != nil {
		t.Error(err)
	}
	if b.Table(1)[0] == 0 && b.Table(1)[1] == 0 {
		t.Error("table reads zeros after MADV_DONTNEED: the page cache must refill it")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := b.Tensor(TableName(0)); !errors.Is(err, ErrClosed) {
		t.Errorf("Tensor after Close = %v", err)
	}
	if err := b.Advise(unix.MADV_NORMAL); !errors.Is(err, ErrClosed) {
		t.Errorf("Advise after Close = %v", err)
	}
}
