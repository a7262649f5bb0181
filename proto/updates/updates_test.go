package updates

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	rows := []Row{{Table: 0, ID: 7, Values: []float32{1, -2, 0.5}}, {Table: 25, ID: 39999999, Values: []float32{float32(math.Copysign(0, -1)), 3, 4}}}
	b, err := Append([]byte("keep"), 3, rows)
	if err != nil {
		t.Fatal(err)
	}
	if string(b[:4]) != "keep" {
		t.Fatal("Append overwrote dst")
	}
	m, err := Decode(b[4:])
	if err != nil {
		t.Fatal(err)
	}
	if m.Len() != 2 || m.Dim() != 3 {
		t.Fatalf("decoded %d rows of %d, want 2 of 3", m.Len(), m.Dim())
	}
	v := make([]float32, 3)
	for i, r := range rows {
		tb, id := m.Row(i)
		if tb != r.Table || id != r.ID {
			t.Errorf("row %d: table %d id %d, want %d %d", i, tb, id, r.Table, r.ID)
		}
		if err := m.Values(i, v); err != nil {
			t.Fatal(err)
		}
		if err := m.CheckFinite(i); err != nil {
			t.Fatal(err)
		}
		for j := range v {
			if math.Float32bits(v[j]) != math.Float32bits(r.Values[j]) {
				t.Errorf("row %d value %d = %v, want %v (bits)", i, j, v[j], r.Values[j])
			}
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	good, err := Append(nil, 2, []Row{{Values: []float32{1, 2}}})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"short":       good[:5],
		"magic":       append([]byte("XMU1"), good[4:]...),
		"truncated":   good[:len(good)-1],
		"trailing":    append(append([]byte(nil), good...), 0),
		"zero rows":   append(append([]byte(nil), good[:8]...), 0, 0, 0, 0),
		"zero width":  append(append([]byte("RMU1"), 0, 0, 0, 0), good[8:]...),
		"count large": append(append([]byte(nil), good[:8]...), 0xff, 0xff, 0, 0),
	}
	for name, b := range cases {
		if _, err := Decode(b); !errors.Is(err, ErrEncoding) {
			t.Errorf("%s: err = %v, want ErrEncoding", name, err)
		}
	}
}

func TestNonFinite(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		b, err := Append(nil, 4, []Row{{Values: []float32{1, 2, 3, 4}}, {Values: []float32{0, 0, bad, 0}}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, 4)
		if err := m.Values(0, v); err != nil {
			t.Fatal(err)
		}
		for _, err := range []error{m.Values(1, v), m.CheckFinite(1)} {
			if !errors.Is(err, ErrValue) || !strings.Contains(err.Error(), "row 1, value 2") {
				t.Errorf("%v: err = %v, want ErrValue naming row 1, value 2", bad, err)
			}
		}
	}
}

func TestAppendAndSubjectRefuse(t *testing.T) {
	if _, err := Append(nil, 2, nil); err == nil {
		t.Error("an empty message was encoded")
	}
	if _, err := Append(nil, 2, []Row{{Values: []float32{1}}}); err == nil {
		t.Error("a row of the wrong width was encoded")
	}
	if _, err := Append(nil, 1, make([]Row, MaxRows+1)); err == nil {
		t.Error("more than MaxRows rows were encoded")
	}
	for _, id := range []string{"", "a.b", "a*", "a>", "a b"} {
		if _, err := RowsSubject(id); err == nil {
			t.Errorf("RowsSubject(%q) succeeded", id)
		}
	}
	if s, err := RowsSubject("dlrm-cap1000-seed1"); err != nil || s != SubjectPrefix+"dlrm-cap1000-seed1" {
		t.Errorf("RowsSubject = %q, %v", s, err)
	}
}

// TestCheckFiniteMatchesValues compares the word-at-a-time check with the
// per-value one on every exponent, at every position of the unrolled
// loop's words and of its tail, on odd widths too.
func TestCheckFiniteMatchesValues(t *testing.T) {
	for _, dim := range []int{1, 2, 3, 8, 11, 21, 128} {
		for e := 0; e < 256; e += 5 {
			for at := range dim {
				v := make([]float32, dim)
				for j := range v {
					v[j] = float32(j) - 1.5
				}
				v[at] = math.Float32frombits(uint32(e)<<23 | 0x1234)
				b, err := Append(nil, dim, []Row{{Values: v}})
				if err != nil {
					t.Fatal(err)
				}
				m, err := Decode(b)
				if err != nil {
					t.Fatal(err)
				}
				want := m.Values(0, make([]float32, dim))
				if got := m.CheckFinite(0); (got == nil) != (want == nil) || got != nil && got.Error() != want.Error() {
					t.Fatalf("dim %d exponent %d at %d: CheckFinite %v, Values %v", dim, e, at, got, want)
				}
			}
		}
	}
}

// BenchmarkCheckFinite checks a full message of rows of the model's width.
func BenchmarkCheckFinite(b *testing.B) {
	rows := make([]Row, MaxRows)
	for i := range rows {
		v := make([]float32, 128)
		for j := range v {
			v[j] = float32(i*128+j) * 1e-3
		}
		rows[i] = Row{Table: 0, ID: i, Values: v}
	}
	buf, err := Append(nil, 128, rows)
	if err != nil {
		b.Fatal(err)
	}
	m, err := Decode(buf)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(MaxRows * 128 * 4))
	for b.Loop() {
		for i := range m.Len() {
			if err := m.CheckFinite(i); err != nil {
				b.Fatal(err)
			}
		}
	}
}
