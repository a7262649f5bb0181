package model

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
)

// exportChunkElems is how many float32 values one export job generates and
// writes: 4 MiB, big enough that a WriteAt is cheap per byte, small enough
// that progress moves and cancellation is prompt. It is a multiple of
// EmbeddingDim, so a chunk of a table is whole rows, which are quantized
// on their own.
const exportChunkElems = 1 << 20

// Export writes a bundle of cfg with weights drawn from seed into dir.
// The same cfg and seed always give byte-identical files. The tables are
// stored at cfg.TableDtype: their rows are drawn in float32, the same at
// every precision, and then quantized row by row (Dtype.QuantizeRow). The
// dense parameters are stored at cfg.DenseDtype: drawn in float32 the same
// way, then rounded to the nearest half (see DenseDtype). So the bundles
// of one seed at every precision are one model. The bundle is
// written into a temporary directory beside dir and then swapped into place,
// so a reader never sees a half-written bundle; an existing dir may hold
// only a previous bundle (config.json, model.safetensors), which is
// replaced. progress, if not nil, is called from the calling goroutine with
// the bytes written so far and the total, ending with done == total.
func Export(ctx context.Context, dir string, cfg Config, seed uint64, progress func(done, total int64)) error {
	if err := export(ctx, dir, cfg, seed, progress); err != nil {
		return fmt.Errorf("model: export %s: %w", dir, err)
	}
	return nil
}

func export(ctx context.Context, dir string, cfg Config, seed uint64, progress func(done, total int64)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cfg.Seed = seed
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.TableDtype = cfg.TableDtype.norm()
	cfg.DenseDtype = cfg.DenseDtype.norm()
	return publishBundle(dir, cfg, func(path string) error { return writeWeights(ctx, path, cfg, seed, progress) })
}

// publishBundle writes a bundle of cfg into a temporary directory beside
// dir (config.json, then model.safetensors by writeWeights) and swaps it
// into place, so a reader never sees half a bundle.
func publishBundle(dir string, cfg Config, writeWeights func(path string) error) error {
	dir = filepath.Clean(dir)
	if err := checkReplaceable(dir); err != nil {
		return err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return err
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp makes it 0700
		return err
	}
	cfgJSON, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileSync(filepath.Join(tmp, ConfigFile), append(cfgJSON, '\n')); err != nil {
		return err
	}
	if err := writeWeights(filepath.Join(tmp, WeightsFile)); err != nil {
		return err
	}
	if err := publishDir(tmp, dir); err != nil {
		return err
	}
	published = true
	return syncDir(parent)
}

// checkReplaceable refuses to export over anything but a directory that is
// empty or holds only bundle files, so a mistyped --out never deletes data.
func checkReplaceable(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if n := e.Name(); n != ConfigFile && n != WeightsFile {
			return fmt.Errorf("%s holds %s, which is not part of a bundle; refusing to replace it", dir, n)
		}
	}
	return nil
}

// writeWeights writes model.safetensors: the header, then every tensor
// generated in exportChunkElems chunks by GOMAXPROCS goroutines, each
// chunk encoded at its tensor's precision and written in place with
// WriteAt into a preallocated file.
func writeWeights(ctx context.Context, path string, cfg Config, seed uint64, progress func(done, total int64)) error {
	places, dataLen := layout(cfg)
	header := encodeHeader(places, [][2]string{
		{"format", FormatName},
		{"seed", strconv.FormatUint(seed, 10)},
	})
	dataStart := int64(len(header))
	total := dataStart + dataLen

	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := preallocate(f, total); err != nil {
		return fmt.Errorf("preallocate %d bytes: %w", total, err)
	}
	if _, err := f.WriteAt(header, 0); err != nil {
		return err
	}

	type job struct {
		tensor int    // index into places, also the tensor's stream index
		first  uint64 // first element of the chunk
		n      int    // elements in the chunk
	}
	var jobs []job
	for i, p := range places {
		// The stream index is the tensor's place in the bundle at every
		// precision, so every precision draws the same float32 values.
		elems := p.spec.Elements()
		for first := int64(0); first < elems; first += exportChunkElems {
			jobs = append(jobs, job{i, uint64(first), int(min(exportChunkElems, elems-first))})
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobCh := make(chan job)
	doneCh := make(chan int64)
	errCh := make(chan error, 1)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			vals := make([]float32, exportChunkElems)
			buf := make([]byte, 4*exportChunkElems) // float32 is the widest row
			for j := range jobCh {
				p := places[j.tensor]
				s := newStream(seed, domainWeights, uint64(j.tensor))
				s.uniformFill(vals[:j.n], j.first, initBound(p.spec))
				chunk, at, err := encodeChunk(buf, vals[:j.n], p, j.first, cfg.EmbeddingDim)
				if err == nil {
					_, err = f.WriteAt(chunk, dataStart+p.begin+at)
				}
				if err != nil {
					select {
					case errCh <- err:
					default:
					}
					cancel()
					return
				}
				select {
				case doneCh <- int64(len(chunk)):
				case <-ctx.Done():
					return
				}
			}
		})
	}
	go func() {
		defer close(jobCh)
		for _, j := range jobs {
			select {
			case jobCh <- j:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		wg.Wait()
		close(doneCh)
	}()

	done := dataStart
	if progress != nil {
		progress(done, total)
	}
	for n := range doneCh {
		done += n
		if progress != nil {
			progress(done, total)
		}
	}
	select {
	case err := <-errCh:
		return err
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if done != total {
		return fmt.Errorf("wrote %d of %d bytes", done, total) // cannot happen: every job reported
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// encodeChunk encodes vals, elements first.. of tensor p, into buf at p's
// precision and returns the bytes and their offset within the tensor. A
// table chunk is whole rows (exportChunkElems is a multiple of dim).
func encodeChunk(buf []byte, vals []float32, p placed, first uint64, dim int) ([]byte, int64, error) {
	if p.table == "" && p.dense != DenseFP32 {
		for k, v := range vals {
			h := p.dense.narrow(v)
			if w := p.dense.widen(h); w-w != 0 {
				return nil, 0, fmt.Errorf("tensor %q element %d is %v, which %s stores as %v", p.spec.Name, first+uint64(k), v, p.dense, w)
			}
			binary.LittleEndian.PutUint16(buf[2*k:], h)
		}
		return buf[:2*len(vals)], 2 * int64(first), nil
	}
	if p.table == "" || p.table == DtypeFP32 {
		for k, v := range vals {
			binary.LittleEndian.PutUint32(buf[4*k:], math.Float32bits(v))
		}
		return buf[:4*len(vals)], 4 * int64(first), nil
	}
	rb := p.table.RowBytes(dim)
	rows := len(vals) / dim
	for r := range rows {
		if err := p.table.QuantizeRow(buf[r*rb:(r+1)*rb], vals[r*dim:(r+1)*dim]); err != nil {
			return nil, 0, fmt.Errorf("tensor %q row %d: %w", p.spec.Name, int(first)/dim+r, err)
		}
	}
	return buf[:rows*rb], int64(first) / int64(dim) * int64(rb), nil
}

// writeFileSync writes a small file and flushes it to disk before the
// directory holding it is published.
func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// publishDir moves the finished bundle tmp to dir. When dir already exists
// the two are exchanged atomically where the system can (renameat2
// RENAME_EXCHANGE), else dir is moved aside first; the old bundle is then
// removed. Processes that still map the old model.safetensors keep their
// mapping: the file lives until they unmap it.
func publishDir(tmp, dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return os.Rename(tmp, dir)
	}
	if err := exchange(tmp, dir); err == nil {
		return os.RemoveAll(tmp) // tmp now holds the old bundle
	}
	old := tmp + ".old"
	if err := os.Rename(dir, old); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.Rename(old, dir) // put the old bundle back
		return err
	}
	return os.RemoveAll(old)
}
