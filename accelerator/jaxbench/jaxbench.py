"""JAX's DLRM-DCNv2 dense network, timed per bucket: the yardstick of
`accelerator bench` (see benchmodel.py, which `make bench-model` runs).

The math is model/reference.go's, and the program bench/python/dlrm.py's
(imported from there, as the Python arms run it): bottom MLP with
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
import os
import sys
import time

import numpy as np

# The bundle reader and the forward pass are the Python arms' own
# (bench/python/dlrm.py), so the yardstick is exactly the program they run.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "python"))
from dlrm import dense_params, is_table, make_forward, read_bundle  # noqa: E402

PLUGIN_NAME = "recmesh_pjrt"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="model bundle directory")
    ap.add_argument("--backend", choices=("plugin", "builtin"), required=True)
    ap.add_argument("--plugin", default=os.environ.get("RECMESH_PJRT_PLUGIN", ""),
                    help="PJRT plugin .so for --backend plugin (default $RECMESH_PJRT_PLUGIN)")
    ap.add_argument("--plugin-option", action="append", default=[], metavar="NAME=INT",
                    help="a PJRT client create option for the plugin, e.g. cpu_device_count=1")
    ap.add_argument("--builtin-platform", default="cpu",
                    help="the platform of --backend builtin: cpu (jaxlib's XLA) or cuda (JAX's CUDA plugin)")
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
        os.environ["JAX_PLATFORMS"] = args.builtin_platform
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
        device = jax.devices(args.builtin_platform)[0]

    config, tensors = read_bundle(args.bundle, want=lambda name: not is_table(name))
    params = jax.device_put(dense_params(config, tensors), device)
    forward = jax.jit(make_forward(jax, jnp))
    tables, dim, num_dense = len(config["vocab_sizes"]), config["embedding_dim"], config["num_dense"]
    print(f"jax: backend={args.backend} platform={device.platform} device={device.device_kind!r} "
          f"jax={jax.__version__} devices={len(jax.devices(args.builtin_platform if args.backend == 'builtin' else PLUGIN_NAME))} "
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
