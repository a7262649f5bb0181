// Package inference holds the generated Go code of the Open Inference
// Protocol v2 gRPC API (package inference, service GRPCInferenceService),
// wire-compatible with KServe v2 and Triton clients.
//
// The source is grpc_service.proto beside this file; `make proto` at the
// repository root regenerates grpc_service.pb.go and grpc_service_grpc.pb.go,
// and `make proto-check` fails when they are stale.
package inference
