package server

import (
	"testing"
	"time"
)

// TestExecTimesQuantile: the estimate is a high quantile of the recent
// window, so one slow run does not move it, a sustained slowdown does, and
// old runs fall out of the window.
func TestExecTimesQuantile(t *testing.T) {
	et := newExecTimes([]int{1, 2})
	if et.estimate(0) != 0 {
		t.Fatal("an estimate before any run")
	}
	for range execWindow - 1 {
		et.observe(0, time.Millisecond)
	}
	if got := et.observe(0, time.Second); got != time.Millisecond {
		t.Errorf("one outlier in %d runs moved the p90 to %v", execWindow, got)
	}
	var got time.Duration
	for range execWindow / 2 {
		got = et.observe(0, 3*time.Millisecond)
	}
	if got != 3*time.Millisecond {
		t.Errorf("after half the window ran at 3 ms the estimate is %v", got)
	}
	for range execWindow {
		got = et.observe(0, 2*time.Millisecond)
	}
	if got != 2*time.Millisecond {
		t.Errorf("after a whole window at 2 ms the estimate is %v (old runs not forgotten)", got)
	}
	if et.estimate(1) != 0 {
		t.Error("bucket 2 got an estimate from bucket 1's runs")
	}
}
