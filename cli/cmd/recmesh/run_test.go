package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the mesh's writers and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMeshStopsChildren: stop sends SIGTERM in the reverse of the start
// order, waits for each child, kills one that ignores SIGTERM once the
// grace ends, and keeps every line of their output, prefixed.
func TestMeshStopsChildren(t *testing.T) {
	out := &syncBuffer{}
	m := &mesh{out: out, grace: 300 * time.Millisecond, exited: make(chan string, 4)}
	// first exits on SIGTERM after saying so; stubborn ignores it.
	if err := m.start("first", nil, "/bin/sh", "-c", `trap 'echo terminated; exit 0' TERM; echo hello; while :; do sleep 0.02; done`); err != nil {
		t.Fatal(err)
	}
	if err := m.start("stubborn", nil, "/bin/sh", "-c", `trap '' TERM; echo ready; while :; do sleep 0.02; done`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !(strings.Contains(out.String(), "hello") && strings.Contains(out.String(), "ready")) {
		if time.Now().After(deadline) {
			t.Fatalf("children did not start: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	m.stop()
	took := time.Since(start)
	if took > 5*time.Second {
		t.Fatalf("stop took %v", took)
	}
	if took < 300*time.Millisecond {
		t.Errorf("stop took %v: the stubborn child was not given its grace", took)
	}
	got := out.String()
	for _, want := range []string{"first       | hello\n", "stubborn    | ready\n", "first       | terminated\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Index(got, "terminated") < strings.Index(got, "ready") {
		t.Error("first was stopped before it started?")
	}
	m.mu.Lock()
	left := len(m.children)
	m.mu.Unlock()
	if left != 0 {
		t.Errorf("%d children still tracked after stop", left)
	}
}
