// Package frontend owns recmesh's client-facing gRPC server: it speaks the
// Open Inference Protocol v2 (KServe v2 / Triton inference.GRPCInferenceService)
// for one DLRM-DCNv2 model, validates every request completely from its
// bytes, decodes the inputs straight into a Backend slot (a shared-memory
// lane in production), waits for the scores and answers.
//
// It also owns what makes a frontend process one of N interchangeable
// replicas: a listener with SO_REUSEPORT so that several processes share one
// port, the standard gRPC health service and server reflection, a graceful
// drain on shutdown (readiness first, then stop accepting, then finish the
// calls in flight, then close the backend), the Prometheus metrics
// recmesh_frontend_* and OpenTelemetry tracing through otelgrpc.
//
// The port is served by grpc-go, or with Options.Transport "lean" by
// package h2unary: recmesh's own HTTP/2 transport for unary calls, which
// spends about a quarter less CPU on a small call and serves the same
// services, limits, admission, TLS, tracing and drain, but no streaming
// method (server reflection, health Watch).
//
// What it does not own: batching, embedding lookups and the model itself
// live behind the Backend interface (backend.go). How backend failures
// become gRPC status codes is one table, in codes.go.
package frontend
