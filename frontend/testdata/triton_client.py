"""Drive a recmesh frontend with Triton's own Python gRPC client.

Run by triton_test.go; it is the third-party proof of wire compatibility.
Reads the examples from --inputs (JSON: n, dense, sparse), calls the server
the ways a Triton user would, and prints one JSON object of what came back;
the Go test does the asserting against the reference model.

  raw_INT32 / raw_INT64     InferenceServerClient.infer (raw_input_contents)
  typed_INT32 / typed_INT64 the generated stub with typed contents, which
                            tritonclient's InferInput cannot send
  raw_in_typed_out          raw inputs, output parameter binary_data=false
  invalid                   an id outside its table: the status must come back
"""

import argparse
import json
import sys

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException


def infer_raw(client, model, dense, sparse, datatype, binary_data=True):
    inputs = [
        grpcclient.InferInput("dense", list(dense.shape), "FP32"),
        grpcclient.InferInput("sparse", list(sparse.shape), datatype),
    ]
    inputs[0].set_data_from_numpy(dense)
    inputs[1].set_data_from_numpy(sparse)
    outputs = [grpcclient.InferRequestedOutput("score")]
    request_id = "raw-" + datatype
    if not binary_data:
        # tritonclient's gRPC InferRequestedOutput has no binary_data switch
        # (it is an HTTP notion there), so set the parameter on the proto.
        outputs[0]._output.parameters["binary_data"].bool_param = False
        request_id = "raw-typed-out"
    res = client.infer(model, inputs, outputs=outputs, request_id=request_id, client_timeout=60)
    resp = res.get_response()
    out = resp.outputs[0]
    if resp.raw_output_contents:
        scores = res.as_numpy("score")
        shape, values = list(scores.shape), scores.reshape(-1).tolist()
        dtype = str(scores.dtype)
    else:
        shape, values, dtype = list(out.shape), list(out.contents.fp32_contents), "typed"
    return {
        "id": resp.id,
        "model_name": resp.model_name,
        "model_version": resp.model_version,
        "name": out.name,
        "datatype": out.datatype,
        "shape": shape,
        "dtype": dtype,
        "raw_entries": len(resp.raw_output_contents),
        "scores": values,
    }


def infer_typed(stub, model, dense, sparse, datatype):
    n = dense.shape[0]
    req = service_pb2.ModelInferRequest(model_name=model, model_version="1", id="typed-" + datatype)
    d = req.inputs.add(name="dense", datatype="FP32", shape=[n, dense.shape[1]])
    d.contents.fp32_contents.extend(dense.reshape(-1).tolist())
    s = req.inputs.add(name="sparse", datatype=datatype, shape=[n, sparse.shape[1]])
    if datatype == "INT32":
        s.contents.int_contents.extend(sparse.reshape(-1).tolist())
    else:
        s.contents.int64_contents.extend(sparse.reshape(-1).tolist())
    req.outputs.add(name="score")
    resp = stub.ModelInfer(req, timeout=60)
    out = resp.outputs[0]
    return {
        "id": resp.id,
        "model_name": resp.model_name,
        "model_version": resp.model_version,
        "name": out.name,
        "datatype": out.datatype,
        "shape": list(out.shape),
        "dtype": "typed",
        "raw_entries": len(resp.raw_output_contents),
        "scores": list(out.contents.fp32_contents),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="host:port of the frontend")
    ap.add_argument("--inputs", required=True, help="JSON file with n, dense, sparse")
    ap.add_argument("--model", default="dlrm")
    args = ap.parse_args()

    with open(args.inputs) as f:
        data = json.load(f)
    n = data["n"]
    dense = np.asarray(data["dense"], dtype=np.float32).reshape(n, -1)
    sparse32 = np.asarray(data["sparse"], dtype=np.int32).reshape(n, -1)

    out = {}
    client = grpcclient.InferenceServerClient(url=args.url)
    out["server_live"] = client.is_server_live()
    out["server_ready"] = client.is_server_ready()
    out["model_ready"] = client.is_model_ready(args.model)
    out["server_metadata"] = client.get_server_metadata(as_json=True)
    out["model_metadata"] = client.get_model_metadata(args.model, as_json=True)

    out["raw_INT32"] = infer_raw(client, args.model, dense, sparse32, "INT32")
    out["raw_INT64"] = infer_raw(client, args.model, dense, sparse32.astype(np.int64), "INT64")
    out["raw_in_typed_out"] = infer_raw(client, args.model, dense, sparse32, "INT32", binary_data=False)

    with grpc.insecure_channel(args.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        out["typed_INT32"] = infer_typed(stub, args.model, dense, sparse32, "INT32")
        out["typed_INT64"] = infer_typed(stub, args.model, dense, sparse32.astype(np.int64), "INT64")

    bad = sparse32.copy()
    bad[n - 1, 14] = 3  # column 14 is table 5, which has 3 rows in the cap-1000 model
    try:
        infer_raw(client, args.model, dense, bad, "INT32")
        out["invalid"] = None
    except InferenceServerException as e:
        out["invalid"] = {"status": e.status(), "message": e.message()}

    try:
        client.get_model_metadata("nosuchmodel")
        out["unknown_model"] = None
    except InferenceServerException as e:
        out["unknown_model"] = {"status": e.status(), "message": e.message()}

    # Triton's extensions, read with Triton's own messages: the model's
    # configuration, the statistics of the calls above, the repository.
    out["model_config"] = client.get_model_config(args.model, as_json=True)
    out["statistics"] = client.get_inference_statistics(args.model, as_json=True)
    out["repository_index"] = client.get_model_repository_index(as_json=True)

    client.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
