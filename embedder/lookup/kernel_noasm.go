//go:build !amd64 || !gc || noasm

package lookup

import "github.com/recmesh/recmesh/model"

// supportedFor lists the kernels this build runs at any precision: only
// the plain-Go one.
func supportedFor(model.Dtype) []kernel { return []kernel{kernelGeneric} }

// pool runs the plain-Go kernel on n checked examples.
func (k kernel) pool(t *Tables, out []float32, ids []int32, n int) {
	poolGeneric(t, out, ids, n)
}
