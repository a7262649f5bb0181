package server

import (
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
)

// program is what the serving loop needs of a compiled model: an
// *executor.Executor (through pjrtProgram) in production. It is the seam
// the package's tests run the loop through with a plain-Go stand-in,
// because compiling the real program takes far longer than the tests.
type program interface {
	Buckets() []int
	MaxBucket() int
	BucketFor(n int) (bucket, index int, err error)
	Config() model.Config
	// NewInputs wraps a staging buffer in place (zero-copy staging);
	// NewHostInputs makes a private region the batches are copied into.
	NewInputs(mem []byte, rows int) (inputs, error)
	NewHostInputs(rows int) (inputs, error)
	// Run executes n examples from in and writes n scores.
	Run(in inputs, n int, scores []float32) error
	Close()
}

// inputs is an input region of a program (*executor.Inputs).
type inputs interface {
	CopyRows(src []byte, n int) error
	Close()
}

// pjrtProgram is the compiled program. It is a value holding the pointer,
// so two wrappers of one executor compare equal (the server keys its
// reference counts by program).
type pjrtProgram struct{ *executor.Executor }

func (p pjrtProgram) NewInputs(mem []byte, rows int) (inputs, error) {
	in, err := p.Executor.NewInputs(mem, rows)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return in, nil
}

func (p pjrtProgram) NewHostInputs(rows int) (inputs, error) {
	in, err := p.Executor.NewHostInputs(rows)
	if err != nil {
		return nil, err
	}
	return in, nil
}

// Run accepts only regions this program made.
func (p pjrtProgram) Run(in inputs, n int, scores []float32) error {
	return p.Executor.Run(in.(*executor.Inputs), n, scores)
}
