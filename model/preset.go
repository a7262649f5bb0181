package model

import (
	"fmt"
	"slices"
	"strings"
)

// Preset names, for Preset and `recmesh export --preset`.
const (
	// PresetMLPerf is the MLPerf DLRMv2 model (DLRMv2).
	PresetMLPerf = "mlperf"
	// PresetHostbound keeps the MLPerf tables, vocabularies, hotness and
	// 214 ids per example but shrinks the dense network as far as the
	// config allows, so a benchmark of it measures the host path (request
	// decoding, lookups, transport) rather than the matrix multiplies. The
	// goal was a dense network one core runs in at most a tenth of the time
	// the lookups of the same examples take; see HostboundBottomMLP for how
	// close it gets.
	PresetHostbound = "hostbound"
)

// The dense network of the hostbound preset: the smallest a config can
// describe (one 13→128 bottom layer, no cross layers, a single logit over
// the 3456-wide interaction vector), since no shape reaches the preset's
// goal on the PJRT CPU plugin. Measured on one core of a 2-vCPU Xeon VM
// (taskset -c 0, cap-850000 tables, lookups ≈ 10 µs per example at any
// batch), the dense time per example over the lookup time is about 8 at
// bucket 1, 0.6 at bucket 16 and 0.22 at bucket 128 (MLPerf's: 300, 90,
// 35): the plugin's per-call cost (≈ 80 µs, half of it its thread pool
// spinning on the one core) bounds buckets 1 and 16, and reading the
// 3456-wide interaction vector bounds bucket 128. One rank-4 cross layer
// and a [8, 1] top MLP cost 3× as much at 128.
var (
	HostboundBottomMLP   = []int{EmbeddingDim}
	HostboundTopMLP      = []int{1}
	HostboundCrossLayers = 0
	HostboundCrossRank   = 0
)

// presets maps each preset name to the config name it writes and its
// dense network.
var presets = map[string]func() (name string, bottom, top []int, layers, rank int){
	PresetMLPerf: func() (string, []int, []int, int, int) {
		return "dlrm-dcnv2", BottomMLP, TopMLP, NumCrossLayers, CrossRank
	},
	PresetHostbound: func() (string, []int, []int, int, int) {
		return "dlrm-dcnv2-hostbound", HostboundBottomMLP, HostboundTopMLP, HostboundCrossLayers, HostboundCrossRank
	},
}

// PresetNames lists the preset names in a stable order (the default first).
func PresetNames() []string { return []string{PresetMLPerf, PresetHostbound} }

// Preset returns the named preset with every vocabulary capped at maxVocab
// (0 or negative means uncapped). Every preset has the DLRMv2 input layout;
// they differ in the dense network and the config name.
func Preset(name string, maxVocab int) (Config, error) {
	p, ok := presets[name]
	if !ok {
		return Config{}, fmt.Errorf("model: unknown preset %q, want one of %s", name, strings.Join(PresetNames(), ", "))
	}
	cfgName, bottom, top, layers, rank := p()
	cfg := DLRMv2(maxVocab)
	cfg.Name = cfgName
	cfg.BottomMLP = slices.Clone(bottom)
	cfg.TopMLP = slices.Clone(top)
	cfg.CrossLayers = layers
	cfg.CrossRank = rank
	return cfg, nil
}
