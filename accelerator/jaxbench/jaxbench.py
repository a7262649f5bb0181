"""JAX's DLRM-DCNv2 dense network, timed per bucket: the yardstick of
`accelerator bench` (see benchmodel.py, which `make bench-model` runs).

The math is model/reference.go's, and the program bench/python/dlrm.py's
(imported from there, as the Python arms run it): bottom MLP with
ReLU after every layer; x0 = concat(bottom output, the pooled vectors
flattened); cross layers x_{l+1} = x0 * ((x_l @ V_l) @ U_l + b_l) + x_l; top
MLP with ReLU after every layer but the last; sigmoid. Every width comes
from the bundle's config.json, the weights from its model.safetensors (only
the dense tensors are read: the embedding tables do not take part).

The dense weights are the bundle's precision (config.json's dense_dtype:
fp32, fp16 or bf16; a half's value is its exact widening to float32), and
the math is float32 whatever it is. --dense-compute (dlrm.DENSE_COMPUTE):

  half   (the default) the weights in half precision on the device, read
         as dlrm.py's plan for the backend has each bucket read them
         (dlrm.HALF_PLAN on jaxlib's CPU backend, dlrm.PLUGIN_HALF_PLAN on
         the plugin, jnp.dot(x, w.astype(float32)) off a CPU): "JAX at the
         same precision";
  fp32   the weights widened to float32 at load, the float32 program:
         "JAX in float32", the same program as a float32 bundle's;
  auto   per bucket the faster of the two, as the Python arms run.

A float32 bundle runs the float32 program whatever the choice.

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

  jax: backend=<b> bucket=<n> examples_per_s=<x> calls=<k> seconds=<s> dense_dtype=<d> dense_compute=<c>

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
from dlrm import (DENSE_COMPUTE, dense_dtype, dense_plan, describe_plan, device_dense_params,  # noqa: E402
                  is_table, make_forward, read_bundle)

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
    ap.add_argument("--dense-compute", choices=DENSE_COMPUTE, default="half",
                    help="a half-precision bundle's weights: half (on the device in half precision, float32 "
                         "math), fp32 (widened at load) or auto (per bucket the faster, as the Python arms)")
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
    # XLA's intra-op threads (only auto's plan depends on them): the
    # plugin's PJRT_NPROC, else the usable CPUs.
    threads = len(os.sched_getaffinity(0))
    if args.backend == "plugin" and os.environ.get("PJRT_NPROC", "").isdigit():
        threads = int(os.environ["PJRT_NPROC"])
    plan = dense_plan(config, args.dense_compute, device.platform, threads,
                      "plugin" if args.backend == "plugin" else "jaxlib")
    host_params = device_dense_params(config, tensors, args.dense_compute, plan)
    described = describe_plan(config, plan, host_params)
    params = jax.device_put(host_params, device)
    del host_params, tensors
    forward = jax.jit(make_forward(jax, jnp, plan))
    tables, dim, num_dense = len(config["vocab_sizes"]), config["embedding_dim"], config["num_dense"]
    precision = f"dense_dtype={dense_dtype(config)} dense_compute={args.dense_compute}"
    print(f"jax: backend={args.backend} platform={device.platform} device={device.device_kind!r} "
          f"jax={jax.__version__} devices={len(jax.devices(args.builtin_platform if args.backend == 'builtin' else PLUGIN_NAME))} "
          f"affinity={sorted(os.sched_getaffinity(0))} {precision} weights={described!r}", flush=True)

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
        print(f"jax: backend={args.backend} bucket={b} examples_per_s={runs * b / el:.0f} calls={runs} seconds={el:.3f} "
              f"{precision}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
