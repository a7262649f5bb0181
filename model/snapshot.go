package model

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"unsafe"
)

// WriteBundle writes a bundle of cfg at dir whose tensors hold the bytes
// data returns for each, by name, exactly as the bundle stores them (the
// tables at cfg.TableDtype's row layout, the dense parameters at
// cfg.DenseDtype). It is how a serving process writes a snapshot of what
// it serves, row updates included: the result opens with Open like any
// export. Like Export, it writes beside dir and swaps the bundle into
// place.
func WriteBundle(dir string, cfg Config, data func(name string) ([]byte, error)) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("model: write bundle %s: %w", dir, err)
	}
	cfg.TableDtype = cfg.TableDtype.norm()
	cfg.DenseDtype = cfg.DenseDtype.norm()
	err := publishBundle(dir, cfg, func(path string) error {
		places, _ := layout(cfg)
		header := encodeHeader(places, [][2]string{
			{"format", FormatName},
			{"seed", strconv.FormatUint(cfg.Seed, 10)},
			{"updates_seq", strconv.FormatUint(cfg.UpdatesSeq, 10)},
		})
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		w := bufio.NewWriterSize(f, 1<<20)
		if _, err := w.Write(header); err != nil {
			return err
		}
		for _, p := range places {
			b, err := data(p.spec.Name)
			if err != nil {
				return fmt.Errorf("tensor %s: %w", p.spec.Name, err)
			}
			if int64(len(b)) != p.size {
				return fmt.Errorf("tensor %s: %d bytes, its %s layout takes %d", p.spec.Name, len(b), p.dtype, p.size)
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		return f.Close()
	})
	if err != nil {
		return fmt.Errorf("model: write bundle %s: %w", dir, err)
	}
	return nil
}

// StoredBytes returns tensor name's bytes as the bundle stores them: a
// table's rows at its precision, a dense parameter at the bundle's dense
// precision. It is a view of the mapping, valid until Close.
func (b *Bundle) StoredBytes(name string) ([]byte, error) {
	for i, s := range b.Config.Tables() {
		if s.Name == name {
			return b.TableData(i), nil
		}
	}
	if !slices.ContainsFunc(b.Config.DenseParams(), func(s ParamSpec) bool { return s.Name == name }) {
		return nil, fmt.Errorf("model: bundle %s has no tensor %s", b.Dir, name)
	}
	// Little-endian values, as safetensors stores them (the mesh runs on
	// little-endian machines only).
	if h := b.ParamBits(name); h != nil {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(h))), 2*len(h)), nil
	}
	v := b.Param(name)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v)), nil
}
