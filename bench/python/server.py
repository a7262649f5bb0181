#!/usr/bin/env python3
"""Python baseline arms of the recmesh benchmark.

They serve the DLRM-DCNv2 model over the same Open Inference Protocol v2
gRPC API (inference.GRPCInferenceService) as recmesh, so one load generator
drives every arm. This is the natural Python deployment of a JAX model:

  py     one process: a grpcio server with --workers threads; per request,
         NumPy `take` + `sum` embedding lookups into a preallocated
         (B, 26, 128) buffer, then the DCNv2 dense network under `jax.jit`
         on the CPU, compiled once per power-of-two batch bucket (requests
         are padded up to their bucket).
  py-mp  --processes such servers sharing one port with SO_REUSEPORT, each
         with its own private copy of the tables and its own jitted network.
         The parent only starts them: it never imports gRPC, NumPy or JAX,
         and each child is a fresh interpreter (subprocess), since fork()
         after gRPC or JAX have started threads is unsafe.

The math is model/reference.go's: bottom MLP with ReLU after every layer;
x0 = concat(bottom output, 26 pooled vectors) (3456 wide); three cross
layers x_{l+1} = x0 * ((x_l @ V_l) @ U_l + b_l) + x_l; top MLP with ReLU
after every layer but the last; sigmoid. Weights are stored [in, out] in the
bundle's model.safetensors, which is parsed here (an 8-byte little-endian
header length, a JSON header, then the data) and read into private memory.

Protocol: one line on stdout per milestone, for whoever started the server:
"BOUND host:port" once listening (ServerReady still false), "READY
host:port" once the bundle is loaded and every warm-up bucket compiled
(ServerReady and ModelReady true from then on). Logs go to stderr.
"""

import argparse
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

# Only the standard library is imported at the top: py-mp's parent must
# start its children before anything starts threads.

MODEL_NAME = "dlrm"
NUM_TABLES = 26
NUM_DENSE = 13
EMBEDDING_DIM = 128
MAX_MESSAGE_BYTES = 64 << 20
SERVER_NAME = "recmesh-bench-python"

log = logging.getLogger("bench-py")


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    default_stubs = os.environ.get(
        "RECMESH_BENCH_PYGEN", os.path.join(here, "..", "..", ".deps", "bench-pygen"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["py", "py-mp"], default="py")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (IPv6 without brackets)")
    p.add_argument("--port", type=int, default=8001,
                   help="port; 0 picks a free one (printed on the BOUND/READY lines)")
    p.add_argument("--bundle", required=True, help="bundle directory (config.json, model.safetensors)")
    p.add_argument("--workers", type=int, default=8, help="gRPC worker threads per process")
    p.add_argument("--processes", type=int, default=2, help="py-mp: server processes")
    p.add_argument("--model-name", default=MODEL_NAME)
    p.add_argument("--max-batch", type=int, default=4096, help="largest request accepted (examples)")
    p.add_argument("--warm-max", type=int, default=256,
                   help="compile buckets 1, 2, 4, ... up to this before READY; larger ones compile on first use")
    p.add_argument("--xla-threads", choices=["auto", "1"], default=None,
                   help="XLA CPU intra-op threads: auto (all CPUs) or 1; default auto for py, "
                        "1 for py-mp (N processes each with an all-CPU pool would oversubscribe)")
    p.add_argument("--stubs", default=default_stubs, help="directory of the generated grpc_service_pb2*.py")
    p.add_argument("--reuseport", action="store_true", help="bind with SO_REUSEPORT (py-mp children)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.workers < 1 or args.processes < 1 or args.max_batch < 1 or args.warm_max < 1:
        p.error("--workers, --processes, --max-batch and --warm-max must be at least 1")
    if args.xla_threads is None:
        args.xla_threads = "1" if args.mode == "py-mp" else "auto"
    return args


def hostport(host, port):
    """host:port, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def announce(word, host, port):
    """Writes a milestone line on stdout for the process that started us."""
    sys.stdout.write(f"{word} {hostport(host, port)}\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- bundle

def read_bundle(directory):
    """Returns (config dict, {tensor name: private float32 ndarray})."""
    import numpy as np

    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    path = os.path.join(directory, "model.safetensors")
    tensors = {}
    with open(path, "rb", buffering=0) as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise ValueError(f"{path}: header length {n} is implausible")
        header = json.loads(f.read(n))
        data_start = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] != "F32":
                raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, want F32")
            begin, end = info["data_offsets"]
            shape = tuple(info["shape"])
            arr = np.empty(shape, dtype="<f4")
            if arr.nbytes != end - begin:
                raise ValueError(f"{path}: tensor {name}: shape {shape} needs {arr.nbytes} bytes, "
                                 f"data_offsets give {end - begin}")
            # readinto fills anonymous memory: every process gets its own
            # copy, as a Python deployment that loads its weights would.
            f.seek(data_start + begin)
            view = memoryview(arr).cast("B")
            got = 0
            while got < arr.nbytes:
                k = f.readinto(view[got:])
                if not k:
                    raise ValueError(f"{path}: tensor {name}: file ends after {got} of {arr.nbytes} bytes")
                got += k
            tensors[name] = arr
    return config, tensors


# ---------------------------------------------------------------- model

def next_pow2(n):
    return 1 << (n - 1).bit_length()


class Model:
    """NumPy lookups and a jitted DCNv2 network over one bundle."""

    def __init__(self, config, tensors, max_batch):
        import jax
        import jax.numpy as jnp
        import numpy as np

        self.np = np
        self.max_batch = max_batch
        self.hotness = list(config["hotness"])
        self.vocab = list(config["vocab_sizes"])
        if len(self.hotness) != NUM_TABLES or config["num_dense"] != NUM_DENSE or config["embedding_dim"] != EMBEDDING_DIM:
            raise ValueError("bundle is not the DLRMv2 layout (26 tables, 13 dense, dim 128)")
        self.width = sum(self.hotness)
        self.offsets = [sum(self.hotness[:t]) for t in range(NUM_TABLES)]
        # The exclusive upper bound of every id column, for one vectorised
        # range check per request.
        self.limits = np.repeat(np.asarray(self.vocab, dtype=np.int64), self.hotness)
        self.tables = [tensors[f"embedding.{t}.weight"] for t in range(NUM_TABLES)]

        def dense_layers(prefix, count):
            return [(jnp.asarray(tensors[f"{prefix}.{i}.kernel"]), jnp.asarray(tensors[f"{prefix}.{i}.bias"]))
                    for i in range(count)]

        # The weights are arguments of the jitted function, not closure
        # constants, so one copy serves every bucket's executable.
        self.params = {
            "bottom": dense_layers("bottom_mlp", len(config["bottom_mlp"])),
            "cross": [(jnp.asarray(tensors[f"cross.{i}.v"]), jnp.asarray(tensors[f"cross.{i}.u"]),
                       jnp.asarray(tensors[f"cross.{i}.bias"])) for i in range(config["cross_layers"])],
            "top": dense_layers("top_mlp", len(config["top_mlp"])),
        }

        hi = jax.lax.Precision.HIGHEST

        def forward(params, dense, pooled):
            x = dense
            for w, b in params["bottom"]:
                x = jax.nn.relu(jnp.dot(x, w, precision=hi) + b)
            x0 = jnp.concatenate([x, pooled.reshape(pooled.shape[0], -1)], axis=1)
            xl = x0
            for v, u, b in params["cross"]:
                xl = x0 * (jnp.dot(jnp.dot(xl, v, precision=hi), u, precision=hi) + b) + xl
            y = xl
            last = len(params["top"]) - 1
            for i, (w, b) in enumerate(params["top"]):
                y = jnp.dot(y, w, precision=hi) + b
                if i < last:
                    y = jax.nn.relu(y)
            return jax.nn.sigmoid(y[:, 0])

        self.forward = jax.jit(forward)
        self.local = threading.local()

    def buffers(self, bucket):
        """This thread's padded (dense, pooled) input buffers for a bucket."""
        bufs = getattr(self.local, "bufs", None)
        if bufs is None:
            bufs = self.local.bufs = {}
        if bucket not in bufs:
            np = self.np
            bufs[bucket] = (np.zeros((bucket, NUM_DENSE), np.float32),
                            np.zeros((bucket, NUM_TABLES, EMBEDDING_DIM), np.float32))
        return bufs[bucket]

    def check_ids(self, sparse):
        """Returns an error message when an id is outside its table."""
        bad = (sparse < 0) | (sparse >= self.limits)
        if not bad.any():
            return None
        e, col = (int(i) for i in self.np.argwhere(bad)[0])
        table = int(self.np.searchsorted(self.offsets, col, side="right")) - 1
        return f"example {e}: id {int(sparse[e, col])} of table {table} outside [0, {self.vocab[table]})"

    def predict(self, dense, sparse):
        """Scores for dense (B, 13) float32 and validated sparse (B, 214) ids."""
        np = self.np
        b = dense.shape[0]
        bucket = next_pow2(b)
        dense_buf, pooled = self.buffers(bucket)
        dense_buf[:b] = dense
        for t, table in enumerate(self.tables):
            off, h = self.offsets[t], self.hotness[t]
            np.take(table, sparse[:, off:off + h], axis=0).sum(axis=1, out=pooled[:b, t])
        # Rows b..bucket keep an earlier request's (finite) values; their
        # scores are computed and dropped.
        scores = self.forward(self.params, dense_buf, pooled)
        return np.asarray(scores)[:b]

    def warm_up(self, warm_max):
        """Compiles every bucket up to warm_max and runs each once."""
        np = self.np
        rng = np.random.default_rng(0)
        bucket = 1
        while bucket <= min(warm_max, self.max_batch):
            t0 = time.monotonic()
            dense = rng.random((bucket, NUM_DENSE), dtype=np.float32)
            sparse = (rng.random((bucket, self.width)) * self.limits).astype(np.int32)
            self.predict(dense, sparse)
            log.info("bucket %d compiled in %.2f s", bucket, time.monotonic() - t0)
            bucket *= 2


# ---------------------------------------------------------------- service

def make_servicer(pb2, pb2_grpc, model_ref, ready, args):
    import grpc
    import numpy as np

    invalid = grpc.StatusCode.INVALID_ARGUMENT

    class Servicer(pb2_grpc.GRPCInferenceServiceServicer):
        def ServerLive(self, request, context):
            return pb2.ServerLiveResponse(live=True)

        def ServerReady(self, request, context):
            return pb2.ServerReadyResponse(ready=ready.is_set())

        def ModelReady(self, request, context):
            ok = ready.is_set() and request.name == args.model_name and request.version in ("", "1")
            return pb2.ModelReadyResponse(ready=ok)

        def ServerMetadata(self, request, context):
            return pb2.ServerMetadataResponse(name=SERVER_NAME, version="1", extensions=[])

        def ModelMetadata(self, request, context):
            if request.name != args.model_name:
                context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.name}'")
            m = pb2.ModelMetadataResponse(name=args.model_name, versions=["1"], platform="jax")
            width = model_ref[0].width if model_ref else 214
            m.inputs.add(name="dense", datatype="FP32", shape=[-1, NUM_DENSE])
            m.inputs.add(name="sparse", datatype="INT32", shape=[-1, width])
            m.outputs.add(name="score", datatype="FP32", shape=[-1, 1])
            return m

        def tensor(self, request, name, kinds, cols, context):
            """Decodes input `name` to a (B, cols) array; kinds maps datatype
            to (numpy dtype, typed contents field)."""
            for i, t in enumerate(request.inputs):
                if t.name == name:
                    break
            else:
                context.abort(invalid, f"missing input '{name}'")
            if t.datatype not in kinds:
                context.abort(invalid, f"input '{name}' has datatype '{t.datatype}', want {' or '.join(kinds)}")
            shape = list(t.shape)
            if len(shape) != 2 or shape[1] != cols or shape[0] < 1:
                context.abort(invalid, f"input '{name}' has shape {shape}, want [B, {cols}]")
            dtype, field = kinds[t.datatype]
            if request.raw_input_contents:
                a = np.frombuffer(request.raw_input_contents[i], dtype=dtype)
            else:
                a = np.asarray(getattr(t.contents, field), dtype=dtype)
            if a.size != shape[0] * cols:
                context.abort(invalid, f"input '{name}' holds {a.size} values, shape {shape} needs {shape[0] * cols}")
            return a.reshape(shape[0], cols)

        def ModelInfer(self, request, context):
            if request.model_name != args.model_name or request.model_version not in ("", "1"):
                context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.model_name}'")
            if not ready.is_set():
                context.abort(grpc.StatusCode.UNAVAILABLE, "model is warming up")
            model = model_ref[0]
            if request.raw_input_contents and len(request.raw_input_contents) != len(request.inputs):
                context.abort(invalid, f"{len(request.raw_input_contents)} raw_input_contents for {len(request.inputs)} inputs")
            if len(request.inputs) != 2:
                context.abort(invalid, f"{len(request.inputs)} inputs, want 'dense' and 'sparse'")
            for o in request.outputs:
                if o.name != "score":
                    context.abort(invalid, f"unknown output '{o.name}'")
            dense = self.tensor(request, "dense", {"FP32": ("<f4", "fp32_contents")}, NUM_DENSE, context)
            sparse = self.tensor(request, "sparse", {"INT32": ("<i4", "int_contents"),
                                                     "INT64": ("<i8", "int64_contents")}, model.width, context)
            b = dense.shape[0]
            if sparse.shape[0] != b:
                context.abort(invalid, f"dense has {b} examples, sparse {sparse.shape[0]}")
            if b > model.max_batch:
                context.abort(invalid, f"{b} examples, at most {model.max_batch} per request")
            if not np.isfinite(dense).all():
                context.abort(invalid, "input 'dense' holds a NaN or infinity")
            msg = model.check_ids(sparse)
            if msg:
                context.abort(invalid, f"input 'sparse': {msg}")
            scores = model.predict(dense, sparse)

            resp = pb2.ModelInferResponse(model_name=args.model_name, model_version="1", id=request.id)
            out = resp.outputs.add(name="score", datatype="FP32", shape=[b, 1])
            if request.raw_input_contents:
                resp.raw_output_contents.append(scores.astype("<f4", copy=False).tobytes())
            else:
                out.contents.fp32_contents.extend(scores.tolist())
            return resp

    return Servicer()


def serve_one(args):
    """The py arm, and each child of py-mp."""
    if args.xla_threads == "1":
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.abspath(args.stubs))
    try:
        import grpc_service_pb2 as pb2
        import grpc_service_pb2_grpc as pb2_grpc
    except ImportError as e:
        sys.exit(f"bench-py: no generated stubs in {args.stubs} ({e}); run `make bench-py-deps`")
    from concurrent import futures

    import grpc

    ready = threading.Event()
    model_ref = []
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="grpc"),
        options=[
            # Off for a lone server, so a port already taken is an error
            # instead of a silent share.
            ("grpc.so_reuseport", 1 if args.reuseport else 0),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ])
    pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        make_servicer(pb2, pb2_grpc, model_ref, ready, args), server)
    port = server.add_insecure_port(hostport(args.host, args.port))
    if port == 0:
        sys.exit(f"bench-py: cannot listen on {hostport(args.host, args.port)}")
    server.start()
    announce("BOUND", args.host, port)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    t0 = time.monotonic()
    config, tensors = read_bundle(args.bundle)
    log.info("bundle %s read in %.1f s", args.bundle, time.monotonic() - t0)
    import jax

    jax.config.update("jax_platforms", "cpu")
    model = Model(config, tensors, args.max_batch)
    model.warm_up(args.warm_max)
    model_ref.append(model)
    ready.set()
    log.info("pid %d ready on %s after %.1f s (%d workers, XLA threads %s)",
             os.getpid(), hostport(args.host, port), time.monotonic() - t0, args.workers, args.xla_threads)
    announce("READY", args.host, port)

    while not stop.wait(1.0):
        pass
    ready.clear()
    server.stop(grace=2).wait()


# ---------------------------------------------------------------- py-mp

def serve_multi(args, argv):
    """Starts --processes children on one SO_REUSEPORT port and supervises
    them: READY once all are; if one dies, all stop."""
    port = args.port
    holder = None
    if port == 0:
        # Reserve a port for all children: a bound, non-listening socket in
        # the same SO_REUSEPORT group takes no connections, and holds the
        # port until every child listens on it.
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        holder = socket.socket(family, socket.SOCK_STREAM)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((args.host, 0))
        port = holder.getsockname()[1]

    child_argv = list(argv)
    # The last --mode/--port/--reuseport given win in argparse.
    child_argv += ["--mode", "py", "--port", str(port), "--reuseport", "--xla-threads", args.xla_threads]

    def die_with_parent():
        # PR_SET_PDEATHSIG: a child outlives a SIGKILLed parent otherwise.
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)

    children = []
    for _ in range(args.processes):
        children.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + child_argv,
                                         stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent))
    log.info("py-mp: started %d processes %s on port %d", len(children), [c.pid for c in children], port)

    pending = {c.pid for c in children}
    lock = threading.Lock()
    all_ready = threading.Event()

    def watch(child):
        for line in child.stdout:
            if line.startswith("READY"):
                with lock:
                    pending.discard(child.pid)
                    if not pending:
                        all_ready.set()

    for c in children:
        threading.Thread(target=watch, args=(c,), daemon=True).start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    announced = False
    rc = 0
    while not stop.wait(0.2):
        if all_ready.is_set() and not announced:
            if holder is not None:
                holder.close()
                holder = None
            announce("READY", args.host, port)
            announced = True
        dead = [c for c in children if c.poll() is not None]
        if dead:
            log.error("py-mp: process %d exited with %d; stopping the others", dead[0].pid, dead[0].returncode)
            rc = 1
            break
    for c in children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for c in children:
        try:
            c.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait()
    sys.exit(rc)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s bench-py[{os.getpid()}] %(levelname)s %(message)s")
    if args.mode == "py-mp":
        serve_multi(args, argv)
    else:
        serve_one(args)


if __name__ == "__main__":
    main()
