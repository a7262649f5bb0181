package inference

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestWireContract pins the names and numbers that v2 clients (tritonclient,
// the KServe SDK) depend on, so an edit of the .proto that would break wire
// compatibility fails here rather than in a client.
func TestWireContract(t *testing.T) {
	fd := File_inference_grpc_service_proto
	if fd.Package() != "inference" {
		t.Fatalf("package %s", fd.Package())
	}
	svc := fd.Services().ByName("GRPCInferenceService")
	if svc == nil {
		t.Fatal("no GRPCInferenceService")
	}
	for _, m := range []struct{ name, in, out string }{
		{"ServerLive", "ServerLiveRequest", "ServerLiveResponse"},
		{"ServerReady", "ServerReadyRequest", "ServerReadyResponse"},
		{"ModelReady", "ModelReadyRequest", "ModelReadyResponse"},
		{"ServerMetadata", "ServerMetadataRequest", "ServerMetadataResponse"},
		{"ModelMetadata", "ModelMetadataRequest", "ModelMetadataResponse"},
		{"ModelInfer", "ModelInferRequest", "ModelInferResponse"},
		{"ModelConfig", "ModelConfigRequest", "ModelConfigResponse"},
		{"ModelStatistics", "ModelStatisticsRequest", "ModelStatisticsResponse"},
		{"RepositoryIndex", "RepositoryIndexRequest", "RepositoryIndexResponse"},
	} {
		md := svc.Methods().ByName(protoreflect.Name(m.name))
		if md == nil || string(md.Input().Name()) != m.in || string(md.Output().Name()) != m.out || md.IsStreamingClient() || md.IsStreamingServer() {
			t.Errorf("method %s: want unary %s -> %s", m.name, m.in, m.out)
		}
	}

	fields := map[string]map[string]protoreflect.FieldNumber{
		"ServerLiveResponse":                   {"live": 1},
		"ServerReadyResponse":                  {"ready": 1},
		"ModelReadyRequest":                    {"name": 1, "version": 2},
		"ModelReadyResponse":                   {"ready": 1},
		"ServerMetadataResponse":               {"name": 1, "version": 2, "extensions": 3},
		"ModelMetadataRequest":                 {"name": 1, "version": 2},
		"ModelMetadataResponse":                {"name": 1, "versions": 2, "platform": 3, "inputs": 4, "outputs": 5},
		"ModelMetadataResponse.TensorMetadata": {"name": 1, "datatype": 2, "shape": 3},
		"InferParameter":                       {"bool_param": 1, "int64_param": 2, "string_param": 3, "double_param": 4, "uint64_param": 5},
		"InferTensorContents": {"bool_contents": 1, "int_contents": 2, "int64_contents": 3, "uint_contents": 4,
			"uint64_contents": 5, "fp32_contents": 6, "fp64_contents": 7, "bytes_contents": 8},
		"ModelInferRequest": {"model_name": 1, "model_version": 2, "id": 3, "parameters": 4, "inputs": 5,
			"outputs": 6, "raw_input_contents": 7},
		"ModelInferRequest.InferInputTensor":           {"name": 1, "datatype": 2, "shape": 3, "parameters": 4, "contents": 5},
		"ModelInferRequest.InferRequestedOutputTensor": {"name": 1, "parameters": 2},
		"ModelInferResponse": {"model_name": 1, "model_version": 2, "id": 3, "parameters": 4, "outputs": 5,
			"raw_output_contents": 6},
		"ModelInferResponse.InferOutputTensor": {"name": 1, "datatype": 2, "shape": 3, "parameters": 4, "contents": 5},
		// Triton's extensions, as its grpc_service.proto numbers them.
		"ModelConfigRequest":      {"name": 1, "version": 2},
		"ModelConfigResponse":     {"config": 1},
		"ModelStatisticsRequest":  {"name": 1, "version": 2},
		"ModelStatisticsResponse": {"model_stats": 1},
		"ModelStatistics": {"name": 1, "version": 2, "last_inference": 3, "inference_count": 4,
			"execution_count": 5, "inference_stats": 6},
		"InferStatistics": {"success": 1, "fail": 2, "queue": 3, "compute_input": 4, "compute_infer": 5,
			"compute_output": 6},
		"StatisticDuration":                  {"count": 1, "ns": 2},
		"RepositoryIndexRequest":             {"repository_name": 1, "ready": 2},
		"RepositoryIndexResponse":            {"models": 1},
		"RepositoryIndexResponse.ModelIndex": {"name": 1, "version": 2, "state": 3, "reason": 4},
	}
	checkFields(t, fd, fields)
	// Triton's model_config.proto, the subset recmesh reports.
	checkFields(t, File_inference_model_config_proto, map[string]map[string]protoreflect.FieldNumber{
		"ModelConfig": {"name": 1, "platform": 2, "backend": 17, "max_batch_size": 4, "input": 5, "output": 6,
			"instance_group": 7, "dynamic_batching": 11, "parameters": 14},
		"ModelInput":           {"name": 1, "data_type": 2, "dims": 4},
		"ModelOutput":          {"name": 1, "data_type": 2, "dims": 3},
		"ModelDynamicBatching": {"preferred_batch_size": 1, "max_queue_delay_microseconds": 2},
		"ModelParameter":       {"string_value": 1},
		"ModelInstanceGroup":   {"name": 1, "count": 2, "kind": 4},
	})
	for name, num := range map[string]protoreflect.EnumNumber{"TYPE_INT32": 8, "TYPE_INT64": 9, "TYPE_FP32": 11} {
		if v := File_inference_model_config_proto.Enums().ByName("DataType").Values().ByName(protoreflect.Name(name)); v == nil || v.Number() != num {
			t.Errorf("DataType.%s: want %d", name, num)
		}
	}
}

func checkFields(t *testing.T, fd protoreflect.FileDescriptor, fields map[string]map[string]protoreflect.FieldNumber) {
	t.Helper()
	for msg, want := range fields {
		d, err := findMessage(fd, msg)
		if err != "" {
			t.Errorf("%s: %s", msg, err)
			continue
		}
		if d.Fields().Len() != len(want) {
			t.Errorf("%s has %d fields, want %d", msg, d.Fields().Len(), len(want))
		}
		for name, num := range want {
			f := d.Fields().ByName(protoreflect.Name(name))
			if f == nil || f.Number() != num {
				t.Errorf("%s.%s: want field number %d", msg, name, num)
			}
		}
	}
}

func findMessage(fd protoreflect.FileDescriptor, path string) (protoreflect.MessageDescriptor, string) {
	var d protoreflect.MessageDescriptor
	msgs := fd.Messages()
	for _, part := range strings.Split(path, ".") {
		d = msgs.ByName(protoreflect.Name(part))
		if d == nil {
			return nil, "not found"
		}
		msgs = d.Messages()
	}
	return d, ""
}
