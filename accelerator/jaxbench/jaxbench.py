"""JAX's DLRM-DCNv2 dense network, timed per bucket: the yardstick of
`accelerator bench` (see benchmodel.py, which `make bench-model` runs).

The math is model/reference.go's and bench/python/dlrm.py's: bottom MLP with
ReLU after every layer; x0 = concat(bottom output, the pooled vectors
flattened); cross layers x_{l+1} = x0 * ((x_l @ V_l) @ U_l + b_l) + x_l; top
MLP with ReLU after every layer but the last; sigmoid. Every width comes
from the bundle's config.json, the weights from its model.safetensors (only
the dense tensors are read: the embedding tables do not take part).

A run times one backend in one process, so two backends never share a
process's threads:

  --backend plugin   JAX's program on recmesh's PJRT plugin (the .so the
                     accelerator loads), registered with
                     jax._src.xla_bridge.register_plugin
  --backend builtin  JAX's own CPU backend (jaxlib's XLA)

Per bucket it measures what `accelerator bench` measures: the weights and
the inputs already on the device, then calls of the compiled program, each
copying its scores back to host memory, for --duration seconds (at least 3
calls), and prints

  jax: backend=<b> bucket=<n> examples_per_s=<x> calls=<k> seconds=<s>

It pins nothing itself: run it under taskset, as benchmodel.py does. Run
with the bench venv's Python (.deps/bench-venv/bin/python).
"""

import argparse
import json
import os
import struct
import sys
import time

import numpy as np

PLUGIN_NAME = "recmesh_pjrt"


def read_dense_params(bundle):
    """Returns (config dict, {name: float32 ndarray}) for every tensor of
    model.safetensors that is not an embedding table."""
    with open(os.path.join(bundle, "config.json")) as f:
        config = json.load(f)
    path = os.path.join(bundle, "model.safetensors")
    tensors = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        start = 8 + n
        for name, info in header.items():
            if name == "__metadata__" or name.startswith("embedding."):
                continue
            if info["dtype"] != "F32":
                raise ValueError(f"{path}: {name} has dtype {info['dtype']}, want F32")
            begin, end = info["data_offsets"]
            f.seek(start + begin)
            arr = np.frombuffer(f.read(end - begin), dtype="<f4").reshape(info["shape"])
            tensors[name] = arr.astype(np.float32, copy=True)
    return config, tensors


def params_of(config, tensors):
    """The weights as the nested lists forward() takes, shapes checked."""
    def get(name, shape):
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"model.safetensors has no tensor {name}")
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"tensor {name} has shape {t.shape}, config.json gives {shape}")
        return t

    bottom, width = [], config["num_dense"]
    for i, out in enumerate(config["bottom_mlp"]):
        bottom.append((get(f"bottom_mlp.{i}.kernel", (width, out)), get(f"bottom_mlp.{i}.bias", (out,))))
        width = out
    width += len(config["vocab_sizes"]) * config["embedding_dim"]
    rank = config["cross_rank"]
    cross = [(get(f"cross.{i}.v", (width, rank)), get(f"cross.{i}.u", (rank, width)), get(f"cross.{i}.bias", (width,)))
             for i in range(config["cross_layers"])]
    top = []
    for i, out in enumerate(config["top_mlp"]):
        top.append((get(f"top_mlp.{i}.kernel", (width, out)), get(f"top_mlp.{i}.bias", (out,))))
        width = out
    return {"bottom": bottom, "cross": cross, "top": top}


def make_forward(jax, jnp):
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

    return forward


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="model bundle directory")
    ap.add_argument("--backend", choices=("plugin", "builtin"), required=True)
    ap.add_argument("--plugin", default=os.environ.get("RECMESH_PJRT_PLUGIN", ""),
                    help="PJRT plugin .so for --backend plugin (default $RECMESH_PJRT_PLUGIN)")
    ap.add_argument("--plugin-option", action="append", default=[], metavar="NAME=INT",
                    help="a PJRT client create option for the plugin, e.g. cpu_device_count=1")
    ap.add_argument("--buckets", default="1,16,128", help="comma-separated batch buckets")
    ap.add_argument("--duration", type=float, default=1.0, help="measured seconds per bucket")
    ap.add_argument("--dump-stablehlo", metavar="DIR",
                    help="write the StableHLO JAX lowers for every bucket to DIR/jax_b<n>.mlir")
    args = ap.parse_args(argv)
    buckets = [int(b) for b in args.buckets.split(",") if b.strip()]

    if args.backend == "plugin":
        if not args.plugin or not os.path.isfile(args.plugin):
            ap.error(f"--backend plugin needs the plugin .so (--plugin or RECMESH_PJRT_PLUGIN), got {args.plugin!r}")
        # Only the named plugin: JAX must not pick the built-in backend.
        os.environ["JAX_PLATFORMS"] = PLUGIN_NAME
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp

    if args.backend == "plugin":
        from jax._src import xla_bridge
        options = {}
        for kv in args.plugin_option:
            k, _, v = kv.partition("=")
            options[k] = int(v)
        xla_bridge.register_plugin(PLUGIN_NAME, library_path=args.plugin, options=options or None)
        device = jax.devices(PLUGIN_NAME)[0]
    else:
        device = jax.devices("cpu")[0]

    config, tensors = read_dense_params(args.bundle)
    params = jax.device_put(params_of(config, tensors), device)
    forward = jax.jit(make_forward(jax, jnp))
    tables, dim, num_dense = len(config["vocab_sizes"]), config["embedding_dim"], config["num_dense"]
    print(f"jax: backend={args.backend} platform={device.platform} device={device.device_kind!r} "
          f"jax={jax.__version__} devices={len(jax.devices(device.platform if args.backend == 'builtin' else PLUGIN_NAME))} "
          f"affinity={sorted(os.sched_getaffinity(0))}", flush=True)

    rng = np.random.default_rng(1)
    for b in buckets:
        dense = jax.device_put(rng.random((b, num_dense), dtype=np.float32), device)
        pooled = jax.device_put((rng.random((b, tables, dim), dtype=np.float32) - 0.5) * 0.1, device)
        if args.dump_stablehlo:
            os.makedirs(args.dump_stablehlo, exist_ok=True)
            with open(os.path.join(args.dump_stablehlo, f"jax_b{b}.mlir"), "w") as f:
                f.write(forward.lower(params, dense, pooled).as_text())
        np.asarray(forward(params, dense, pooled))  # compile and warm up
        np.asarray(forward(params, dense, pooled))
        runs = 0
        start = time.perf_counter()
        while True:
            np.asarray(forward(params, dense, pooled))
            runs += 1
            el = time.perf_counter() - start
            if el >= args.duration and runs >= 3:
                break
        print(f"jax: backend={args.backend} bucket={b} examples_per_s={runs * b / el:.0f} calls={runs} seconds={el:.3f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
