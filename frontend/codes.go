package frontend

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// This file is the one place where failures become gRPC status codes. Every
// handler returns only errors built here, so a client can act on the code
// alone:
//
//	failure                                      code                client's next step
//	-------------------------------------------  ------------------  -------------------------------
//	request fails validation (decode.go):        INVALID_ARGUMENT    fix the request; never retry
//	  missing/extra/duplicate tensor, datatype,
//	  shape, batch size 0 or above MaxBatch,
//	  raw bytes of the wrong length, raw mixed
//	  with typed contents, id outside its
//	  table, NaN/Inf dense value, unknown
//	  requested output
//	unknown model name or version                NOT_FOUND           fix the request
//	Backend error wrapping ErrFull               RESOURCE_EXHAUSTED  back off, then retry
//	Backend error wrapping ErrUnavailable        UNAVAILABLE         retry, another frontend is fine
//	Backend error *BadInputError                 INVALID_ARGUMENT    fix the request
//	Backend error wrapping ctx deadline          DEADLINE_EXCEEDED   give up or retry with more time
//	Backend error wrapping ctx cancellation      CANCELLED           (the client went away)
//	Backend broke its contract (slot or score    INTERNAL            report a bug
//	  count wrong) or any other Backend error
//
// The checks run in the order of the table, so an error that wraps both a
// sentinel and a context error gets the sentinel's code.

// invalidArgument is a request the server can never serve as sent.
func invalidArgument(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// notFound is a request for a model or version this server does not have.
func notFound(format string, args ...any) error {
	return status.Errorf(codes.NotFound, format, args...)
}

// backendStatus turns an error from Backend.Acquire or Slot.Submit into the
// status the client sees, following the table above. The message keeps the
// backend's own text (it says which ring or peer), prefixed with what the
// client should do.
func backendStatus(err error) error {
	var bad *BadInputError
	switch {
	case errors.As(err, &bad):
		return status.Errorf(codes.InvalidArgument, "input rejected by the backend: %v", bad)
	case errors.Is(err, ErrFull):
		return status.Errorf(codes.ResourceExhausted, "server is at capacity, retry later: %v", err)
	case errors.Is(err, ErrUnavailable):
		return status.Errorf(codes.Unavailable, "model backend is unavailable: %v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "deadline exceeded before the scores arrived: %v", err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "call cancelled: %v", err)
	default:
		return status.Errorf(codes.Internal, "model backend failed: %v", err)
	}
}

// errContract is wrapped by failures where a Backend broke its interface
// contract; they map to INTERNAL.
var errContract = errors.New("backend broke its contract")

func contractError(format string, args ...any) error {
	return backendStatus(fmt.Errorf("%w: %s", errContract, fmt.Sprintf(format, args...)))
}
