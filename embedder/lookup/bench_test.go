package lookup

import (
	"flag"
	"math/rand/v2"
	"testing"

	"github.com/recmesh/recmesh/model"
)

// benchVocabCap caps every table of the benchmark tables. The default
// (≈190 MB of tables) is past the last-level cache, so the benchmark
// measures misses; cmd/lookupbench runs the full 3.2 GB set.
var benchVocabCap = flag.Int("lookup.vocabcap", 50000, "vocabulary cap of the BenchmarkPool tables")

// BenchmarkPool pools batches of 128 uniform random examples with every
// kernel of every precision; run with -benchmem to see that a lookup
// allocates nothing.
func BenchmarkPool(b *testing.B) {
	for _, d := range model.Dtypes() {
		var tab *Tables
		if d == model.DtypeFP32 {
			tab = newTestTables(b, *benchVocabCap, 11)
		} else {
			tab = newQuantTables(b, d, *benchVocabCap, 11)
		}
		for _, kernel := range tab.Kernels() {
			b.Run(string(d)+"/"+kernel, func(b *testing.B) { benchPool(b, tab, kernel) })
		}
	}
}

func benchPool(b *testing.B, tab *Tables, kernel string) {
	const batch, batches = 128, 64
	rng := rand.New(rand.NewPCG(11, 11))
	ids := randomIDs(tab, batch*batches, rng)
	out := make([]float32, tab.OutLen(batch))
	if err := tab.SetKernel(kernel); err != nil {
		b.Fatal(err)
	}
	w := batch * tab.Width()
	i := 0
	for b.Loop() {
		if err := tab.Pool(out, ids[i*w:(i+1)*w], batch); err != nil {
			b.Fatal(err)
		}
		i = (i + 1) % batches
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "examples/s")
}
