package report

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/recmesh/recmesh/bench/loadgen"
)

// QueueP99 is the p99 response time, in the unit of service, of an ideal
// single server that takes exactly service per call, serves calls in
// arrival order and never idles while one waits, under Poisson arrivals
// at rate per unit (the M/D/1 queue). It is +Inf at or past saturation.
//
// The open-loop points ask an arm for a fraction of the throughput it
// claims, on a server pinned to one core: whatever the design, calls
// that arrive while the core is busy wait, and at 80 % utilisation the
// p99 of that wait alone is about ten service times. Set beside a
// measured p99 it says how much of it is queueing any one-core server
// would see, and how much is the arm's. It is computed by simulation
// (Lindley's recursion over a fixed seed: within 3 % of Erlang's closed
// form at 80 % load), which, unlike that alternating series, is stable
// in floating point at any load.
func QueueP99(rate, service float64) float64 {
	if !(rate > 0) || !(service > 0) {
		return 0
	}
	if rate*service >= 1 {
		return math.Inf(1)
	}
	const calls = 1_000_000
	rng := rand.New(rand.NewPCG(1, 2))
	resp := make([]float64, calls)
	wait := 0.0
	for i := range resp {
		resp[i] = wait + service
		// The next call waits for what is left of this one's.
		wait = max(0, wait+service-rng.ExpFloat64()/rate)
	}
	slices.Sort(resp)
	return resp[calls*99/100]
}

// queueFloorMs is QueueP99 for an open-loop point: its achieved rate, and
// as service time the server's measured CPU per call (the mesh or the
// Python server is pinned to one core, so that is what each call keeps
// the core busy for). 0 when the point has no CPU figure.
func queueFloorMs(p *loadgen.Point) float64 {
	s := p.Summary
	if !(s.RequestsPerS > 0) || !(s.ServerCPUCores > 0) {
		return 0
	}
	return 1000 * QueueP99(s.RequestsPerS, s.ServerCPUCores/s.RequestsPerS)
}
