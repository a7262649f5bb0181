package frontend

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBackendErrors checks codes.go's table: each backend failure, at either
// step, becomes its documented code, and an acquired slot is always
// released exactly once.
func TestBackendErrors(t *testing.T) {
	dense, sparse := inputs(2)
	for _, tc := range []struct {
		name    string
		setup   func(f *fakeBackend)
		ctx     func() (context.Context, context.CancelFunc)
		code    codes.Code
		msg     string
		acquire bool // the slot was acquired, so it must be released
	}{
		{name: "acquire full", setup: func(f *fakeBackend) { f.acquireErr = fmt.Errorf("lane 3: request ring: %w", ErrFull) },
			code: codes.ResourceExhausted, msg: "server is at capacity, retry later: lane 3: request ring: backend full"},
		{name: "acquire unavailable", setup: func(f *fakeBackend) { f.acquireErr = fmt.Errorf("embedder pid 7 died: %w", ErrUnavailable) },
			code: codes.Unavailable, msg: "model backend is unavailable: embedder pid 7 died: backend unavailable"},
		{name: "acquire other", setup: func(f *fakeBackend) { f.acquireErr = errors.New("segment header corrupt") },
			code: codes.Internal, msg: "model backend failed: segment header corrupt"},
		{name: "submit full", setup: func(f *fakeBackend) { f.submitErr = fmt.Errorf("batch queue: %w", ErrFull) },
			code: codes.ResourceExhausted, msg: "server is at capacity, retry later: batch queue: backend full", acquire: true},
		{name: "submit unavailable", setup: func(f *fakeBackend) { f.submitErr = fmt.Errorf("accelerator gone: %w", ErrUnavailable) },
			code: codes.Unavailable, msg: "model backend is unavailable: accelerator gone: backend unavailable", acquire: true},
		{name: "submit bad input", setup: func(f *fakeBackend) {
			f.submitErr = fmt.Errorf("embedder: %w", &BadInputError{Row: 1, Table: 5, Reason: "id 2 is outside the table's 2 rows"})
		}, code: codes.InvalidArgument, msg: "input rejected by the backend: row 1, table 5: id 2 is outside the table's 2 rows", acquire: true},
		{name: "submit bad dense input", setup: func(f *fakeBackend) {
			f.submitErr = &BadInputError{Row: 0, Table: -1, Reason: "denormal"}
		}, code: codes.InvalidArgument, msg: "input rejected by the backend: row 0, dense input: denormal", acquire: true},
		{name: "submit deadline", setup: func(f *fakeBackend) { f.submitErr = fmt.Errorf("waiting for completion: %w", context.DeadlineExceeded) },
			code: codes.DeadlineExceeded, msg: "deadline exceeded before the scores arrived: waiting for completion: context deadline exceeded", acquire: true},
		{name: "submit cancelled", setup: func(f *fakeBackend) { f.submitErr = context.Canceled },
			code: codes.Canceled, msg: "call cancelled: context canceled", acquire: true},
		{name: "sentinel wins over context", setup: func(f *fakeBackend) {
			f.submitErr = errors.Join(fmt.Errorf("ring: %w", ErrUnavailable), context.Canceled)
		}, code: codes.Unavailable, msg: "model backend is unavailable: ring: backend unavailable\ncontext canceled", acquire: true},
		{name: "submit other", setup: func(f *fakeBackend) { f.submitErr = errors.New("boom") },
			code: codes.Internal, msg: "model backend failed: boom", acquire: true},
		{name: "wrong score count", setup: func(f *fakeBackend) { f.shortScores = true },
			code: codes.Internal, msg: "model backend failed: backend broke its contract: 1 scores for 2 examples", acquire: true},
		{name: "wrong slot size", setup: func(f *fakeBackend) { f.shortSlot = true },
			code: codes.Internal, msg: "model backend failed: backend broke its contract: slot for 2 examples has 25 dense and 428 sparse values", acquire: true},
		{name: "real deadline while blocked", setup: func(f *fakeBackend) { f.block = make(chan struct{}) },
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 20*time.Millisecond)
			},
			code: codes.DeadlineExceeded, msg: "deadline exceeded before the scores arrived: context deadline exceeded", acquire: true},
		{name: "real cancel while blocked", setup: func(f *fakeBackend) {
			f.block = make(chan struct{})
			f.entered = make(chan struct{}, 1)
		}, ctx: nil, code: codes.Canceled, msg: "call cancelled: context canceled", acquire: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeBackend()
			tc.setup(f)
			s := newTestService(t, f)
			ctx, cancel := context.WithCancel(context.Background())
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			if f.entered != nil {
				go func() { <-f.entered; cancel() }()
			}
			_, err := s.ModelInfer(ctx, rawRequest(dense, sparse, 2, false))
			st, ok := status.FromError(err)
			if !ok {
				t.Fatalf("error %v is not a status", err)
			}
			if st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("got  %v %q\nwant %v %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
			want := int64(0)
			if tc.acquire {
				want = 1
			}
			if r := f.releases.Load(); r != want {
				t.Errorf("%d Release calls, want %d", r, want)
			}
		})
	}
}
