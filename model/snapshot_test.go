package model

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
)

// TestWriteBundleRoundTrips writes a bundle from another's stored bytes,
// with one table row changed and updates_seq set, at every dense
// precision: it opens, holds exactly those bytes, and records the
// sequence.
func TestWriteBundleRoundTrips(t *testing.T) {
	for _, dd := range []DenseDtype{DenseFP32, DenseFP16} {
		t.Run(string(dd), func(t *testing.T) {
			cfg, err := Preset(PresetHostbound, 50)
			if err != nil {
				t.Fatal(err)
			}
			cfg.TableDtype, cfg.DenseDtype = DtypeInt8, dd
			src := filepath.Join(t.TempDir(), "src")
			if err := Export(context.Background(), src, cfg, 3, nil); err != nil {
				t.Fatal(err)
			}
			b, err := Open(src)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			changed := bytes.Clone(b.TableData(2))
			for i := range b.Config.TableDtype.RowBytes(cfg.EmbeddingDim) {
				changed[i] ^= 0x5a
			}
			out := b.Config
			out.UpdatesSeq = 42
			dst := filepath.Join(t.TempDir(), "snap")
			err = WriteBundle(dst, out, func(name string) ([]byte, error) {
				if name == b.Config.Tables()[2].Name {
					return changed, nil
				}
				return b.StoredBytes(name)
			})
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Config.UpdatesSeq != 42 {
				t.Errorf("updates_seq %d, want 42", s.Config.UpdatesSeq)
			}
			for _, spec := range append(cfg.Tables(), cfg.DenseParams()...) {
				want, _ := b.StoredBytes(spec.Name)
				if spec.Name == cfg.Tables()[2].Name {
					want = changed
				}
				got, err := s.StoredBytes(spec.Name)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s: bytes differ after the round trip", spec.Name)
				}
			}
			if _, err := b.StoredBytes("nope"); err == nil {
				t.Error("StoredBytes of an unknown tensor succeeded")
			}
			short := func(name string) ([]byte, error) { b, err := b.StoredBytes(name); return b[:len(b)-1], err }
			if err := WriteBundle(filepath.Join(t.TempDir(), "bad"), out, short); err == nil {
				t.Error("a tensor one byte short was written")
			}
		})
	}
}
