package frontend

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// guardedBackend is a fakeBackend whose memory is lost (its Guard fails)
// for the first lose calls.
type guardedBackend struct {
	*fakeBackend
	lose   int64
	guards atomic.Int64
}

func (g *guardedBackend) Guard(fn func() error) error {
	if g.guards.Add(1) <= g.lose {
		return fmt.Errorf("test: %w", ErrMemoryLost)
	}
	return fn()
}

// TestMemoryLostRetried: a call whose backend memory is lost mid-call is
// tried again once the backend serves, and answered; one whose memory
// stays lost fails UNAVAILABLE within the retry bound.
func TestMemoryLostRetried(t *testing.T) {
	for _, tc := range []struct {
		lose int64
		want codes.Code
	}{{1, codes.OK}, {1 << 40, codes.Unavailable}} {
		f := newFakeBackend()
		g := &guardedBackend{fakeBackend: f, lose: tc.lose}
		s := newTestService(t, f)
		s.backend = g
		dense, sparse := inputs(2)
		_, err := s.ModelInfer(context.Background(), rawRequest(dense, sparse, 2, false))
		if got := status.Code(err); got != tc.want {
			t.Fatalf("memory lost %d times: %v (%v), want %v", tc.lose, got, err, tc.want)
		}
		if g.guards.Load() < 2 {
			t.Fatalf("memory lost %d times: guarded %d times, want a retry", tc.lose, g.guards.Load())
		}
	}
}
