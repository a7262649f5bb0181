package main

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestDefaultCPUs(t *testing.T) {
	for n, want := range map[int][2]string{1: {"", ""}, 2: {"0", "1"}, 4: {"0-2", "3-3"}, 24: {"0-17", "18-23"}} {
		s, c := defaultCPUs(n)
		if s != want[0] || c != want[1] {
			t.Errorf("defaultCPUs(%d) = %q, %q, want %q, %q", n, s, c, want[0], want[1])
		}
	}
}

func TestLists(t *testing.T) {
	if v, err := intList("-x", " 1, 16,128 "); err != nil || !slices.Equal(v, []int{1, 16, 128}) {
		t.Errorf("intList = %v, %v", v, err)
	}
	if _, err := intList("-x", "1,0"); err == nil {
		t.Error("intList accepted 0")
	}
	if v, err := floatList("-x", "0.5,0.8"); err != nil || !slices.Equal(v, []float64{0.5, 0.8}) {
		t.Errorf("floatList = %v, %v", v, err)
	}
	if v, err := floatList("-x", ""); err != nil || len(v) != 0 {
		t.Errorf("floatList(\"\") = %v, %v", v, err)
	}
	if _, err := floatList("-x", "-1"); err == nil {
		t.Error("floatList accepted -1")
	}
}

func TestWarmMax(t *testing.T) {
	c := &config{batches: []int{1, 16, 200}, memBatch: 16}
	if got := c.warmMax(); got != 256 {
		t.Errorf("warmMax = %d, want 256", got)
	}
	c.batches = []int{1}
	if got := c.warmMax(); got != 128 { // parity sends 128
		t.Errorf("warmMax = %d, want 128", got)
	}
}

func TestParseArm(t *testing.T) {
	s, err := parseArm("recmesh-model")
	if err != nil || !s.mesh || s.mode != "model" {
		t.Errorf("parseArm(recmesh-model) = %+v, %v", s, err)
	}
	if s, err := parseArm("py-mp"); err != nil || s.py != "py-mp" {
		t.Errorf("parseArm(py-mp) = %+v, %v", s, err)
	}
	if _, err := parseArm("xse"); err == nil {
		t.Error("parseArm accepted xse")
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-arms", "nope", "-client-cpus", "", "-server-cpus", ""},
		{"-batches", "x", "-client-cpus", "", "-server-cpus", ""},
		{"-memory-arms", "py", "-client-cpus", "", "-server-cpus", ""},
		{"-repeats", "0", "-client-cpus", "", "-server-cpus", ""},
	} {
		err := run(context.Background(), args, io.Discard, io.Discard)
		if err == nil || strings.Contains(err.Error(), "model config") {
			t.Errorf("run(%q) = %v, want a flag error", args, err)
		}
	}
}
