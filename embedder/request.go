package embedder

import (
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// decodeRequest is the embedder's reader of a request's payload: the
// frontend encoded it through the same model.RequestLayout.Payload views.
// shm has already checked that the slot header is consistent and that the
// payload lies in the lane arena; this checks what only the model knows,
// the example count against the batch limit and the payload's size and
// alignment against the layout, and returns StatusInvalid for a request
// that fails. The views alias the lane arena, which the frontend may still
// rewrite: the worker copies the ids before validating them.
func decodeRequest(cfg model.Config, maxBatch int, req *shm.Request) (model.RequestPayload, shm.Status) {
	if req.Examples < 1 || req.Examples > maxBatch {
		return model.RequestPayload{}, shm.StatusInvalid
	}
	p, err := cfg.Request(req.Examples).Payload(req.Payload)
	if err != nil {
		return model.RequestPayload{}, shm.StatusInvalid
	}
	return p, shm.StatusOK
}
