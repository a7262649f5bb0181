#!/usr/bin/env python3
"""Python baseline arms of the recmesh benchmark.

They serve the DLRM-DCNv2 model over the same Open Inference Protocol v2
gRPC API (inference.GRPCInferenceService) as recmesh, so one load generator
drives every arm. They are the Python designs of the published study
(shared/reference/published-dlrm-benchmark.md), each built the way a
competent Python engineer would, from standard building blocks only: grpcio
servers with a thread pool, NumPy `take` + `sum` embedding lookups into a
(B, 26, 128) buffer, and the DCNv2 dense network under `jax.jit`, compiled
once per power-of-two batch bucket (inputs are padded up to their bucket).
The tables are held at the bundle's precision (config.json table_dtype:
fp32, fp16, int8, int4) and dequantized on the gather (dlrm.py); so are the
dense weights (dense_dtype: fp32, fp16, bf16), which the network reads in
half precision where that was measured faster, computing in float32
(--dense-compute, dlrm.py).

  py           one process; each request is gathered and run through the
               network by the gRPC worker thread that received it.
  py-batch     one process; worker threads queue validated requests in a
               DynamicBatcher (batcher.py: 1 ms window, at most --max-batch
               examples) and one batching thread runs ONE gather and ONE
               jitted call per batch, then hands each request its scores.
  py-mp        --processes SO_REUSEPORT frontend processes, each with its own
               private table copy and NumPy gather, feeding ONE device-owner
               process that runs the network: per request, the frontend
               gathers into a /dev/shm slot and the owner makes one jitted
               call for it and writes the scores back into the slot.
  py-mp-batch  the study's best design: py-mp's frontends, each with a
               DynamicBatcher in front of its gather (one gather per batch,
               straight into a slot), and a device owner that is a zero-wait
               merger: it takes every batch waiting from all frontends,
               concatenates them into one bucket, makes one jitted call and
               writes each batch's scores back; it never waits for more work.
  py-mp-local  --processes SO_REUSEPORT copies of the py server, each with its
               own tables and its own jitted network (an extra arm: on a CPU,
               where the "device" is the host, it avoids the hand-over).

The shared memory of py-mp and py-mp-batch (shm.py): per frontend, one
/dev/shm file of slots (dense, pooled and scores regions); a frontend
submits a filled slot by writing a 16-byte record to one pipe shared by all
frontends, where the device owner sleeps in poll(); the owner signals a
slot's scores through that slot's eventfd, on which the waiting frontend
thread sleeps in read(). Nothing spins, and every hand-over goes through a
system call, which orders the memory accesses around it. The files are
unlinked as soon as they are created (the processes share them by
descriptor), so none is ever left behind.

Tuning choices (each overridable by its flag):
  - Usable CPUs are len(os.sched_getaffinity(0)) (logged at READY), so a
    taskset-pinned arm sizes itself to its pin. Every process that runs JAX
    as the arm's only JAX process (py, py-batch, the device owner) keeps
    XLA's default, an intra-op pool with one thread per usable CPU, so one
    jitted call can use them all; py-mp-local's processes run their dense
    math single-threaded (--xla-threads 1, i.e.
    --xla_cpu_multi_thread_eigen=false), as N processes each with an
    all-CPU pool would oversubscribe the CPUs.
  - py-mp and py-mp-batch frontends never import JAX: they only need grpc
    and NumPy, which keeps their startup and memory small; the device owner
    holds the dense weights and no tables. Every process keeps NumPy's
    OpenBLAS to one thread (OPENBLAS_NUM_THREADS=1): take and sum are not
    BLAS, and idle pools per process only cost memory. Gathers run
    single-threaded in the thread that calls them.
  - --workers gRPC worker threads per process: 8 (the study's) in the
    unbatched arms; 256 in the batching arms, where a worker mostly waits
    for its batch, so that up to 256 concurrent requests per process can
    share batches (threads are started on demand).
  - Each table copy is private anonymous memory (read, not mmapped), one per
    process that gathers, as in the study: py-mp* hold --processes copies,
    each at the bundle's table precision.
  - --dense-compute auto: with a half-precision bundle, each bucket's
    executable reads the weights the way measured faster for its batch size
    and XLA's thread count: the halves at bucket 1 (about 2x float32 there),
    chunked halves up to bucket 256 with one XLA thread, float32 weights
    widened at load otherwise (dlrm.HALF_PLAN has the figures).
  - Warm-up compiles buckets 1, 2, 4, ... up to --warm-max (default 256 for
    the unbatched arms, --max-batch for the batching ones, whose merged
    batches reach it) before READY, in whichever process runs JAX.

Requests are validated (INVALID_ARGUMENT naming the tensor) in the process
and thread that received them, before anything is queued, so a bad request
never touches a batch. The device owner does not listen: a frontend is
ready once a warm-up request has made the round trip through it.

Processes: py and py-batch are one process. The py-mp* parent only starts
and watches its children (device owner first, then the frontends): it never
imports gRPC, NumPy or JAX, and each child is a fresh interpreter
(subprocess), since fork() after gRPC or JAX have started threads is unsafe.
Children die with the parent (PR_SET_PDEATHSIG); if one dies, or does not
stop within 10 s of a stop, the parent stops the rest and exits 1.

Protocol: one line on stdout per milestone, for whoever started the server:
"BOUND host:port" once listening (ServerReady still false), "READY
host:port" once the bundle is loaded, every warm-up bucket compiled and, in
py-mp*, every process ready (ServerReady and ModelReady true from then on).
Logs go to stderr.
"""

import argparse
import faulthandler
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

# Only the standard library is imported at the top: the py-mp* parent must
# start its children before anything starts threads.

MODEL_NAME = "dlrm"
MAX_MESSAGE_BYTES = 64 << 20
SERVER_NAME = "recmesh-bench-python"
MODES = ("py", "py-batch", "py-mp", "py-mp-batch", "py-mp-local")
BATCHED = ("py-batch", "py-mp-batch")
MULTI_PROCESS = ("py-mp", "py-mp-batch", "py-mp-local")
# Slots per py-mp-batch frontend: one batch with the device owner while the
# next is gathered.
BATCH_SLOTS = 2

log = logging.getLogger("bench-py")


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    default_stubs = os.environ.get(
        "RECMESH_BENCH_PYGEN", os.path.join(here, "..", "..", ".deps", "bench-pygen"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, default="py")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (IPv6 without brackets)")
    p.add_argument("--port", type=int, default=8001,
                   help="port; 0 picks a free one (printed on the BOUND/READY lines)")
    p.add_argument("--bundle", required=True, help="bundle directory (config.json, model.safetensors)")
    p.add_argument("--workers", type=int, default=None,
                   help="gRPC worker threads per process (default 8; 256 in the batching arms)")
    p.add_argument("--processes", type=int, default=2, help="py-mp*: frontend (server) processes")
    p.add_argument("--model-name", default=MODEL_NAME)
    p.add_argument("--max-batch", type=int, default=4096,
                   help="largest request accepted and largest batch formed (examples)")
    p.add_argument("--batch-window", type=float, default=1.0,
                   help="batching arms: ms a batch waits for more requests after its first")
    p.add_argument("--warm-max", type=int, default=None,
                   help="compile buckets 1, 2, 4, ... up to this before READY (default 256; the batching "
                        "arms: --max-batch); larger ones compile on first use")
    p.add_argument("--xla-threads", choices=["auto", "1"], default=None,
                   help="XLA CPU intra-op threads: auto (one per usable CPU) or 1; default 1 for "
                        "py-mp-local, auto otherwise")
    p.add_argument("--dense-compute", choices=["auto", "half", "fp32"], default="auto",
                   help="a half-precision bundle's dense weights (config.json dense_dtype fp16/bf16): half "
                        "keeps them in half precision on the device, fp32 widens them at load, auto (the "
                        "default) runs each bucket the way measured faster (dlrm.py); float32 math always")
    p.add_argument("--stubs", default=default_stubs, help="directory of the generated grpc_service_pb2*.py")
    p.add_argument("--log-level", default="INFO")
    # Set by the py-mp* parent for its children.
    p.add_argument("--reuseport", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--role", choices=["owner", "frontend"], help=argparse.SUPPRESS)
    p.add_argument("--link", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    batched = args.mode in BATCHED
    if args.workers is None:
        args.workers = 256 if batched else 8
    if args.warm_max is None:
        args.warm_max = args.max_batch if batched else 256
    if args.xla_threads is None:
        args.xla_threads = "1" if args.mode == "py-mp-local" else "auto"
    if min(args.workers, args.processes, args.max_batch, args.warm_max) < 1 or args.batch_window < 0:
        p.error("--workers, --processes, --max-batch and --warm-max must be at least 1, --batch-window at least 0")
    return args


def hostport(host, port):
    """host:port, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def announce(line):
    """Writes a milestone line on stdout for the process that started us."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- service

def make_servicer(pb2, pb2_grpc, loaded, ready, args):
    """The OIP v2 service over loaded (a dict that gets "model" and
    "embeddings" once ready is set)."""
    import grpc
    import numpy as np

    from batcher import Stopped
    from layout import NUM_DENSE

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
            if not ready.is_set():
                context.abort(grpc.StatusCode.UNAVAILABLE, "model is warming up")
            m = pb2.ModelMetadataResponse(name=args.model_name, versions=["1"], platform="jax")
            m.inputs.add(name="dense", datatype="FP32", shape=[-1, NUM_DENSE])
            m.inputs.add(name="sparse", datatype="INT32", shape=[-1, loaded["embeddings"].width])
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
            embeddings = loaded["embeddings"]
            if request.raw_input_contents and len(request.raw_input_contents) != len(request.inputs):
                context.abort(invalid, f"{len(request.raw_input_contents)} raw_input_contents for {len(request.inputs)} inputs")
            if len(request.inputs) != 2:
                context.abort(invalid, f"{len(request.inputs)} inputs, want 'dense' and 'sparse'")
            for o in request.outputs:
                if o.name != "score":
                    context.abort(invalid, f"unknown output '{o.name}'")
            dense = self.tensor(request, "dense", {"FP32": ("<f4", "fp32_contents")}, NUM_DENSE, context)
            sparse = self.tensor(request, "sparse", {"INT32": ("<i4", "int_contents"),
                                                     "INT64": ("<i8", "int64_contents")}, embeddings.width, context)
            b = dense.shape[0]
            if sparse.shape[0] != b:
                context.abort(invalid, f"dense has {b} examples, sparse {sparse.shape[0]}")
            if b > args.max_batch:
                context.abort(invalid, f"{b} examples, at most {args.max_batch} per request")
            if not np.isfinite(dense).all():
                context.abort(invalid, "input 'dense' holds a NaN or infinity")
            msg = embeddings.check_ids(sparse)
            if msg:
                context.abort(invalid, f"input 'sparse': {msg}")
            try:
                scores = loaded["model"].infer(dense, sparse)
            except Stopped as e:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            except Exception as e:
                log.exception("inference failed")
                context.abort(grpc.StatusCode.INTERNAL, f"inference failed: {e}")

            resp = pb2.ModelInferResponse(model_name=args.model_name, model_version="1", id=request.id)
            out = resp.outputs.add(name="score", datatype="FP32", shape=[b, 1])
            if request.raw_input_contents:
                resp.raw_output_contents.append(scores.astype("<f4", copy=False).tobytes())
            else:
                out.contents.fp32_contents.extend(scores.tolist())
            return resp

    return Servicer()


class StopRequest:
    """A stop asked for by SIGTERM or SIGINT (install) or by another thread
    (set), which the main thread waits for.

    A signal's Python handler runs in the main thread between two
    bytecodes, wherever that thread is. A handler that set a
    threading.Event took the Event's lock, which the main thread may hold
    at that moment inside Event.wait, and the process deadlocked: CI saw a
    py-mp-local process, sent SIGTERM twice (by the test's process-group
    signal and by its supervisor), never stop and never reach the
    faulthandler deadline. This handler only appends to a list, which
    takes no lock, and wait polls."""

    def __init__(self):
        self._asked = []

    def install(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda got, _frame: self._asked.append(got))

    def set(self):
        self._asked.append(None)

    def wait(self, timeout):
        """Sleeps for timeout unless a stop was asked (a handler runs
        during the sleep, which then goes on), and reports whether one
        was."""
        if not self._asked:
            time.sleep(timeout)
        return bool(self._asked)


# STOP_GRACE is how long a stopping server lets its calls finish;
# STOP_DEADLINE when it gives up on a clean stop, under the supervisor's
# 10 s (STOP_WAIT).
STOP_GRACE, STOP_DEADLINE = 2, 8
STOP_WAIT = 10


def serve_grpc(args):
    """py, py-batch, py-mp-local's processes and py-mp*'s frontends: a gRPC
    server, listening at once, ready once arms.load has finished."""
    sys.path.insert(0, os.path.abspath(args.stubs))
    try:
        import grpc_service_pb2 as pb2
        import grpc_service_pb2_grpc as pb2_grpc
    except ImportError as e:
        sys.exit(f"bench-py: no generated stubs in {args.stubs} ({e}); run `make bench-py-deps`")
    from concurrent import futures

    import grpc

    ready = threading.Event()
    loaded = {}
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="grpc"),
        options=[
            # Off for a lone server, so a port already taken is an error
            # instead of a silent share.
            ("grpc.so_reuseport", 1 if args.reuseport else 0),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # As recmesh's frontends do: no bandwidth-probing PING per
            # small request, whose ack the server would read.
            ("grpc.http2.bdp_probe", 0),
        ])
    pb2_grpc.add_GRPCInferenceServiceServicer_to_server(make_servicer(pb2, pb2_grpc, loaded, ready, args), server)
    port = server.add_insecure_port(hostport(args.host, args.port))
    if port == 0:
        sys.exit(f"bench-py: cannot listen on {hostport(args.host, args.port)}")
    server.start()
    announce(f"BOUND {hostport(args.host, port)}")

    stop = StopRequest()
    stop.install()
    failed = []

    def prepare():
        # In a thread, so that the main thread keeps handling signals while
        # a frontend waits for the device owner.
        t0 = time.monotonic()
        try:
            import arms

            loaded["model"], loaded["embeddings"] = arms.load(args)
        except Exception:
            log.exception("cannot load the arm")
            failed.append(True)
            stop.set()
            return
        ready.set()
        log.info("pid %d ready on %s after %.1f s (%s, %d workers, %d usable CPUs, XLA threads %s)",
                 os.getpid(), hostport(args.host, port), time.monotonic() - t0, args.role or args.mode,
                 args.workers, len(os.sched_getaffinity(0)), "none" if args.role == "frontend" else args.xla_threads)
        announce(f"READY {hostport(args.host, port)}")

    threading.Thread(target=prepare, name="prepare", daemon=True).start()
    while not stop.wait(0.2):
        pass
    # Whatever hangs from here on, the process prints where every thread
    # is and exits 1 before its supervisor's deadline, which then fails the
    # stop: a frontend once outlived that deadline in CI on a loaded
    # machine, with nothing in its log to say where it waited.
    faulthandler.dump_traceback_later(STOP_DEADLINE, exit=True)
    ready.clear()
    # gRPC cancels the calls still running after the grace; closing the
    # model then wakes a py-mp handler that waits on its device owner.
    server.stop(grace=STOP_GRACE).wait()
    if "model" in loaded:
        loaded["model"].close()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: the interpreter's finalization would join every thread
    # and run gRPC's exit hooks, and nothing is left to clean up.
    os._exit(1 if failed else 0)


def serve_owner(args):
    """The device owner of py-mp and py-mp-batch. It ignores SIGTERM and
    SIGINT and exits once every frontend has gone (EOF on the submission
    pipe), so that requests in flight at a stop still complete; a dead
    parent kills it (PDEATHSIG SIGKILL)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from arms import DeviceOwner, load_network
    from dlrm import is_table, read_bundle
    from shm import OwnerLink

    link = OwnerLink(json.loads(args.link))
    t0 = time.monotonic()
    config, tensors = read_bundle(args.bundle, want=lambda name: not is_table(name))
    network = load_network(args, config, tensors)
    log.info("device owner pid %d ready after %.1f s (%d usable CPUs, XLA threads %s, %s)",
             os.getpid(), time.monotonic() - t0, len(os.sched_getaffinity(0)), args.xla_threads,
             "zero-wait merger" if args.mode == "py-mp-batch" else "one call per request")
    announce("READY device-owner")
    DeviceOwner(link, network, args.mode == "py-mp-batch", args.max_batch).serve()
    log.info("device owner: every frontend has gone")


# ---------------------------------------------------------------- py-mp*

def supervise(args, argv):
    """Starts the children of a multi-process arm on one SO_REUSEPORT port
    and watches them: BOUND once every server listens, READY once every
    child is ready; if one dies, all stop."""
    import ctypes

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

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()
    # The last of a repeated flag wins in argparse: every child gets the
    # parent's flags, resolved, then its own.
    base = [sys.executable, os.path.abspath(__file__)] + list(argv) + [
        "--workers", str(args.workers), "--warm-max", str(args.warm_max), "--xla-threads", args.xla_threads]
    servers = ["--port", str(port), "--reuseport"]

    def spawn(name, extra, fds=(), deathsig=signal.SIGTERM):
        def die_with_parent():
            # PR_SET_PDEATHSIG: a child outlives a SIGKILLed parent otherwise.
            libc.prctl(1, deathsig)
            if os.getppid() != parent:
                os._exit(1)

        child = subprocess.Popen(base + extra, stdout=subprocess.PIPE, text=True, pass_fds=fds,
                                 preexec_fn=die_with_parent)
        return name, child

    children = []
    if args.mode == "py-mp-local":
        for i in range(args.processes):
            children.append(spawn(f"process {i}", ["--mode", "py"] + servers))
    else:
        from layout import next_pow2
        from shm import Link

        slots = args.workers if args.mode == "py-mp" else BATCH_SLOTS
        link = Link(args.processes, slots, next_pow2(args.max_batch))
        try:
            spec, fds = link.owner()
            children.append(spawn("device owner", ["--role", "owner", "--link", json.dumps(spec)], fds, signal.SIGKILL))
            for i in range(args.processes):
                spec, fds = link.frontend(i)
                children.append(spawn(f"frontend {i}", ["--role", "frontend", "--link", json.dumps(spec)] + servers, fds))
        finally:
            link.close()
    log.info("%s: started %s on port %d", args.mode,
             ", ".join(f"{name} (pid {c.pid})" for name, c in children), port)

    servers_total = len(children) - (args.mode != "py-mp-local")
    lock = threading.Lock()
    counts = {"BOUND": 0, "READY": 0}
    milestones = {"BOUND": threading.Event(), "READY": threading.Event()}

    def watch(child):
        for line in child.stdout:
            word = line.split(" ", 1)[0]
            if word in counts:
                with lock:
                    counts[word] += 1
                    if counts[word] == (servers_total if word == "BOUND" else len(children)):
                        milestones[word].set()

    for _, c in children:
        threading.Thread(target=watch, args=(c,), daemon=True).start()

    stop = StopRequest()
    stop.install()
    said = set()
    dead = []
    rc = 0
    while not stop.wait(0.2):
        for word in ("BOUND", "READY"):
            if milestones[word].is_set() and word not in said:
                if word == "READY" and holder is not None:
                    holder.close()
                    holder = None
                announce(f"{word} {hostport(args.host, port)}")
                said.add(word)
        dead = [(name, c) for name, c in children if c.poll() is not None]
        if dead:
            name, c = dead[0]
            log.error("%s: %s (pid %d) exited with %d; stopping the others", args.mode, name, c.pid, c.returncode)
            rc = 1
            break
    # Frontends first: the device owner ignores SIGTERM and leaves once they
    # have all gone.
    for _, c in children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT
    for name, c in reversed(children):
        try:
            code = c.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            log.error("%s: %s (pid %d) did not stop; killing it", args.mode, name, c.pid)
            c.kill()
            c.wait()
            rc = 1
            continue
        # A child our SIGTERM ended before it set its handler (it was still
        # starting) stopped as asked; any other failure fails the stop.
        if code not in (0, -signal.SIGTERM) and not dead:
            log.error("%s: %s (pid %d) stopped with %d", args.mode, name, c.pid, code)
            rc = 1
    sys.exit(rc)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    # Before NumPy is first imported, in this process and its children.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s bench-py[{os.getpid()}] %(levelname)s %(message)s")
    if args.role == "owner":
        serve_owner(args)
    elif args.mode in MULTI_PROCESS and args.role is None:
        supervise(args, argv)
    else:
        serve_grpc(args)


if __name__ == "__main__":
    main()
