package embedder

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/updates"
)

func loadTestStore(t *testing.T, d model.Dtype) *Store {
	t.Helper()
	cfg, err := model.Preset(model.PresetHostbound, 64)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TableDtype = d
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := model.Export(context.Background(), dir, cfg, 5, nil); err != nil {
		t.Fatal(err)
	}
	s, err := LoadStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func updateRow(table, id int, base float32) updates.Row {
	v := make([]float32, model.EmbeddingDim)
	for j := range v {
		v[j] = base + float32(j)/64
	}
	return updates.Row{Table: table, ID: id, Values: v}
}

func encode(t *testing.T, rows ...updates.Row) updates.Message {
	t.Helper()
	b, err := updates.Append(nil, model.EmbeddingDim, rows)
	if err != nil {
		t.Fatal(err)
	}
	m, err := updates.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestApplyWritesQuantizedRows applies rows at every table precision and
// checks each stored row is what the export's quantizer makes of it, and
// that pooling then reads the new values.
func TestApplyWritesQuantizedRows(t *testing.T) {
	for _, d := range model.Dtypes() {
		t.Run(string(d), func(t *testing.T) {
			s := loadTestStore(t, d)
			last := len(s.Config.VocabSizes) - 1
			rows := []updates.Row{updateRow(0, 0, 1), updateRow(last, s.Config.VocabSizes[last]-1, -2), updateRow(3, 7, 0.5)}
			before := s.TablesHash()
			var u Updater
			if err := s.Apply(&u, encode(t, rows...)); err != nil {
				t.Fatal(err)
			}
			if s.TablesHash() == before {
				t.Fatal("tables hash unchanged by an applied update")
			}
			for _, r := range rows {
				want := make([]byte, s.Tables.RowBytes())
				if err := d.QuantizeRow(want, r.Values); err != nil {
					t.Fatal(err)
				}
				if got := s.Tables.Row(r.Table, r.ID); string(got) != string(want) {
					t.Errorf("table %d row %d: stored bytes differ from the export's quantization", r.Table, r.ID)
				}
			}
			// Pool an example whose every id of table 0 is row 0: the
			// pooled row is hotness × the row's dequantized values.
			width := s.Config.SparseWidth()
			ids := make([]int32, width)
			out := make([]float32, s.Tables.OutLen(1))
			if err := s.Tables.Pool(out, ids, 1); err != nil {
				t.Fatal(err)
			}
			deq := make([]float32, model.EmbeddingDim)
			d.DequantizeRow(deq, s.Tables.Row(0, 0))
			var sum float32
			for range s.Config.Hotness[0] {
				sum += deq[5]
			}
			if math.Float32bits(out[5]) != math.Float32bits(sum) {
				t.Errorf("pooled table 0 element 5 = %v, want %v from the updated row", out[5], sum)
			}
		})
	}
}

// TestApplyRefusesWhole sends messages with one bad row among good ones:
// each is refused with an error naming what is wrong, and nothing at all
// is written.
func TestApplyRefusesWhole(t *testing.T) {
	s := loadTestStore(t, model.DtypeInt8)
	good := updateRow(1, 2, 3)
	nan := updateRow(2, 2, 0)
	nan.Values[9] = float32(math.NaN())
	inf := updateRow(2, 2, 0)
	inf.Values[0] = float32(math.Inf(-1))
	cases := []struct {
		name string
		bad  updates.Row
		is   error
		says string
	}{
		{"unknown table", updateRow(len(s.Config.VocabSizes), 0, 1), ErrBadUpdate, "the model has"},
		{"row out of range", updateRow(0, s.Config.VocabSizes[0], 1), ErrBadUpdate, "has no row"},
		{"NaN", nan, updates.ErrValue, "value 9 is NaN"},
		{"Inf", inf, updates.ErrValue, "value 0 is -Inf"},
	}
	before := s.TablesHash()
	var u Updater
	for _, c := range cases {
		err := s.Apply(&u, encode(t, good, c.bad))
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: err = %v, want %v saying %q", c.name, err, c.is, c.says)
		}
	}
	// A width other than the model's.
	b, err := updates.Append(nil, 64, []updates.Row{{Table: 0, ID: 0, Values: make([]float32, 64)}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := updates.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(&u, m); !errors.Is(err, updates.ErrEncoding) || !strings.Contains(err.Error(), "64 wide") {
		t.Errorf("narrow rows: err = %v", err)
	}
	if s.TablesHash() != before {
		t.Fatal("a refused message changed the tables")
	}
}

// TestApplyNeverTearsARow pools while another goroutine keeps rewriting
// one row between two versions whose every element differs: each pooled
// value must come wholly from one version, never a mix.
func TestApplyNeverTearsARow(t *testing.T) {
	s := loadTestStore(t, model.DtypeFP32)
	a, b := updateRow(0, 0, 1), updateRow(0, 0, 1000)
	ma, mb := encode(t, a), encode(t, b)
	var u Updater
	if err := s.Apply(&u, ma); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var u Updater
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			m := ma
			if i%2 == 1 {
				m = mb
			}
			if err := s.Apply(&u, m); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	width := s.Config.SparseWidth()
	ids := make([]int32, width) // every bag reads row 0 of its table
	out := make([]float32, s.Tables.OutLen(1))
	h := float32(s.Config.Hotness[0])
	for range 20000 {
		s.rows.RLock()
		err := s.Tables.Pool(out, ids, 1)
		s.rows.RUnlock()
		if err != nil {
			t.Fatal(err)
		}
		first := out[0] == h*a.Values[0]
		for j := range model.EmbeddingDim {
			want := b.Values[j] * h
			if first {
				want = a.Values[j] * h
			}
			if out[j] != want {
				t.Fatalf("element %d = %v, want %v: a torn row", j, out[j], want)
			}
		}
	}
}

// TestSnapshotHoldsTheUpdates applies updates, writes a snapshot and
// loads it: the same tables bit for bit, and the sequence recorded.
func TestSnapshotHoldsTheUpdates(t *testing.T) {
	s := loadTestStore(t, model.DtypeInt4)
	var u Updater
	if err := s.Apply(&u, encode(t, updateRow(0, 1, 2), updateRow(5, 0, -1))); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	cfg, err := s.WriteSnapshot(dir, func() uint64 { return 17 })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.UpdatesSeq != 17 {
		t.Fatalf("snapshot config updates_seq %d, want 17", cfg.UpdatesSeq)
	}
	snap, err := LoadStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if snap.Config.UpdatesSeq != 17 || snap.Config.ID() != s.Config.ID() {
		t.Fatalf("loaded snapshot: updates_seq %d, id %s; want 17, %s", snap.Config.UpdatesSeq, snap.Config.ID(), s.Config.ID())
	}
	if snap.TablesHash() != s.TablesHash() {
		t.Fatal("the snapshot's tables differ from the serving ones")
	}
	if _, err := s.WriteSnapshot(dir, nil); err == nil {
		t.Fatal("a snapshot over an existing bundle succeeded")
	}
}
