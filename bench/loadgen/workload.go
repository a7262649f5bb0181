package loadgen

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

// Workload defaults.
const (
	// DefaultPoolRequests is how many distinct requests a run cycles
	// through: enough that a server's caches see fresh ids (1,024 × 16
	// examples × 214 ids is 3.5 M row reads, more than any LLC holds).
	DefaultPoolRequests = 1024
	// DefaultPoolBytes caps the pool's memory, so B_req = 4096 does not
	// pre-build 3.6 GB of requests: the pool shrinks to fit.
	DefaultPoolBytes = 256 << 20
)

// WorkloadOptions describes the requests of a run.
type WorkloadOptions struct {
	// ModelName is the model the requests name (default oip.DefaultModelName).
	ModelName string
	// BatchSize is B_req, the examples per request.
	BatchSize int
	// PoolRequests is how many distinct requests to build (default
	// DefaultPoolRequests), reduced to fit PoolBytes.
	PoolRequests int
	// PoolBytes caps the encoded size of the pool (default DefaultPoolBytes).
	// At least one request is always built.
	PoolBytes int64
	// Seed selects the inputs (model.RandomInputs).
	Seed uint64
	// SparseType is the datatype of the ids: oip.TypeINT32 (default) or
	// oip.TypeINT64.
	SparseType string
}

// Workload is a pool of pre-encoded requests, reused round-robin.
type Workload struct {
	// Requests are the pre-encoded ModelInfer requests.
	Requests []*oip.PreEncoded
	// BatchSize is the examples per request.
	BatchSize int
	// ModelName and SparseType are what the requests carry.
	ModelName  string
	SparseType string
	// RequestBytes is the encoded size of one request.
	RequestBytes int
}

// NewWorkload draws PoolRequests·BatchSize random examples of cfg and
// encodes them into requests of BatchSize examples each.
func NewWorkload(cfg model.Config, o WorkloadOptions) (*Workload, error) {
	if o.BatchSize <= 0 {
		return nil, fmt.Errorf("loadgen: workload: batch size %d, want at least 1", o.BatchSize)
	}
	if o.ModelName == "" {
		o.ModelName = oip.DefaultModelName
	}
	if o.SparseType == "" {
		o.SparseType = oip.TypeINT32
	}
	if o.PoolRequests <= 0 {
		o.PoolRequests = DefaultPoolRequests
	}
	if o.PoolBytes <= 0 {
		o.PoolBytes = DefaultPoolBytes
	}
	idBytes := 4
	if o.SparseType == oip.TypeINT64 {
		idBytes = 8
	}
	// The payload dominates the encoded size; headers add ~100 bytes.
	perRequest := int64(o.BatchSize) * int64(4*cfg.NumDense+idBytes*cfg.SparseWidth())
	n := int(min(int64(o.PoolRequests), max(o.PoolBytes/perRequest, 1)))

	dense, sparse := model.RandomInputs(cfg, o.Seed, n*o.BatchSize)
	w := &Workload{BatchSize: o.BatchSize, ModelName: o.ModelName, SparseType: o.SparseType}
	dw, sw := o.BatchSize*cfg.NumDense, o.BatchSize*cfg.SparseWidth()
	for i := range n {
		req, err := oip.BuildRequest(o.ModelName, cfg, dense[i*dw:(i+1)*dw], sparse[i*sw:(i+1)*sw], o.BatchSize, o.SparseType)
		if err != nil {
			return nil, fmt.Errorf("loadgen: workload: %w", err)
		}
		enc, err := oip.Encode(req)
		if err != nil {
			return nil, fmt.Errorf("loadgen: workload: %w", err)
		}
		w.Requests = append(w.Requests, enc)
	}
	w.RequestBytes = len(w.Requests[0].Bytes)
	return w, nil
}

// ReadConfig reads and validates the config.json of the model bundle in
// dir: all the requests need (the weights are opened only for parity).
// A failure to read the file wraps its *fs.PathError.
func ReadConfig(dir string) (model.Config, error) {
	path := filepath.Join(dir, model.ConfigFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return model.Config{}, fmt.Errorf("model config: %w", err)
	}
	var cfg model.Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return model.Config{}, fmt.Errorf("model config %s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return model.Config{}, fmt.Errorf("model config %s: %w", path, err)
	}
	return cfg, nil
}
