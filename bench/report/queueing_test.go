package report

import (
	"math"
	"testing"
)

// TestQueueP99 checks the simulation against what is known of the M/D/1
// queue: no wait without load, Erlang's closed form, growth with load,
// and saturation.
func TestQueueP99(t *testing.T) {
	const s = 0.004 // 4 ms per call
	if got := QueueP99(1, s); math.Abs(got-s) > 1e-12 {
		t.Errorf("at 0.4 %% load p99 = %v, want the service time %v", got, s)
	}
	// Erlang's closed form of the M/D/1 waiting time, evaluated in
	// 300-digit arithmetic: the response time's p99 is 4.34 service
	// times at ρ = 0.5 and 11.36 at ρ = 0.8.
	for _, c := range []struct{ rho, want float64 }{{0.5, 4.336}, {0.8, 11.356}} {
		got := QueueP99(c.rho/s, s) / s
		if math.Abs(got-c.want) > 0.03*c.want {
			t.Errorf("at ρ=%v p99 = %.2f service times, want %.2f within 3 %%", c.rho, got, c.want)
		}
	}
	prev := 0.0
	for _, rho := range []float64{0.1, 0.3, 0.5, 0.7, 0.9} {
		got := QueueP99(rho/s, s)
		if got <= prev {
			t.Errorf("p99 %v at ρ=%v not above %v at the lower load", got, rho, prev)
		}
		prev = got
	}
	if !math.IsInf(QueueP99(1/s, s), 1) || QueueP99(0, s) != 0 {
		t.Error("saturation is not +Inf, or no load is not 0")
	}
}
