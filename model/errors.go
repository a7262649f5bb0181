package model

import "errors"

// Sentinel errors. Every error the package returns wraps at most one of
// these (plus ErrInvalidConfig from config.go) with context naming the
// bundle, the tensor and what is wrong, so callers can branch with
// errors.Is and still print a message a person can act on.
var (
	// ErrCorrupt means model.safetensors is not a well-formed safetensors
	// file: too short, a bad header, data_offsets that disagree with the
	// shape or run past the end of the file (a truncated copy), tensors that
	// overlap, or non-finite values in a dense parameter.
	ErrCorrupt = errors.New("corrupt bundle")
	// ErrMismatch means model.safetensors is well formed but does not hold
	// what config.json describes: a tensor is missing or unexpected, or has
	// the wrong dtype, shape or size for its precision (a table or dense
	// parameter stored otherwise than config.json's table_dtype or
	// dense_dtype says), or the file was exported with another seed.
	ErrMismatch = errors.New("bundle does not match its config")
	// ErrNoTensor is returned by Bundle.Tensor for a name the bundle lacks.
	ErrNoTensor = errors.New("no such tensor")
	// ErrNotFloat32 is returned by Bundle.Tensor for a table of a bundle
	// whose tables are stored at another precision than fp32.
	ErrNotFloat32 = errors.New("tensor is not float32")
	// ErrClosed is returned when a Bundle is used after Close.
	ErrClosed = errors.New("bundle closed")
	// ErrBadInput means inputs handed to the reference forward pass have the
	// wrong length or an embedding id outside its table.
	ErrBadInput = errors.New("bad model input")
	// ErrBadPayload means a request payload (RequestLayout.Payload) has the
	// wrong size for its example count or is misaligned for its arrays.
	ErrBadPayload = errors.New("bad request payload")
)
