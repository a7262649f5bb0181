package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestBar(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(0, 0)
	b := newBar(&buf, "export", func() time.Time { return clock })

	b.Update(0, 2000)
	clock = clock.Add(10 * time.Millisecond)
	b.Update(500, 2000) // too soon: not drawn
	clock = clock.Add(time.Second)
	b.Update(1000, 2000)
	b.Update(2000, 2000) // complete: always drawn
	b.Finish()
	b.Finish()

	lines := strings.Split(buf.String(), "\r")[1:]
	want := []string{
		"export [                              ]   0% 0 B/2.0 kB 0.0s\x1b[K",
		"export [###############               ]  50% 1.0 kB/2.0 kB 1.0s\x1b[K",
		"export [##############################] 100% 2.0 kB/2.0 kB 1.0s\x1b[K\n",
	}
	if len(lines) != len(want) {
		t.Fatalf("drew %q", buf.String())
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("draw %d = %q, want %q", i, lines[i], want[i])
		}
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 999: "999 B", 1000: "1.0 kB", 75_300_000: "75.3 MB", 3_200_000_000: "3.2 GB",
	} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
