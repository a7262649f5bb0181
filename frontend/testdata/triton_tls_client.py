"""One inference with Triton's own Python gRPC client, optionally over TLS.

Run by cli/e2e/security_tls_test.go. Reads the examples from --inputs
(JSON: n, dense, sparse) like triton_client.py, makes a liveness call and
one raw INT32 inference, and prints one JSON object:

  {"ok": true, "server_live": ..., "scores": [...]}    the calls worked
  {"ok": false, "status": "...", "message": "..."}     a call failed

A failed call is a result, not an error (the Go test asserts refusals), so
the exit status is 0 either way; anything else exits non-zero.
"""

import argparse
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_client import infer_raw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="host:port of the frontend")
    ap.add_argument("--inputs", required=True, help="JSON file with n, dense, sparse")
    ap.add_argument("--model", default="dlrm")
    ap.add_argument("--ssl", action="store_true", help="connect over TLS")
    ap.add_argument("--root-certs", help="PEM file of the CAs to trust (with --ssl)")
    ap.add_argument("--private-key", help="PEM key of the client certificate (mutual TLS)")
    ap.add_argument("--cert-chain", help="PEM client certificate (mutual TLS)")
    ap.add_argument("--timeout", type=float, default=20, help="seconds per call")
    args = ap.parse_args()

    with open(args.inputs) as f:
        data = json.load(f)
    n = data["n"]
    dense = np.asarray(data["dense"], dtype=np.float32).reshape(n, -1)
    sparse32 = np.asarray(data["sparse"], dtype=np.int32).reshape(n, -1)

    client = grpcclient.InferenceServerClient(
        url=args.url,
        ssl=args.ssl,
        root_certificates=args.root_certs,
        private_key=args.private_key,
        certificate_chain=args.cert_chain,
    )
    try:
        live = client.is_server_live(client_timeout=args.timeout)
        res = infer_raw(client, args.model, dense, sparse32, "INT32")
        out = {"ok": True, "server_live": live, "scores": res["scores"]}
    except InferenceServerException as e:
        out = {"ok": False, "status": str(e.status()), "message": str(e.message())}
    finally:
        client.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
