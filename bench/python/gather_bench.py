#!/usr/bin/env python3
"""Times the Python arms' embedding gather (dlrm.Embeddings.gather, the code
the arms serve with) on one pinned core, for each bundle given: B uniform
random examples per call, every table's bag pooled into a (B, 26, 128)
float32 buffer, the stored rows dequantized on the gather at the bundle's
precision. It prints one line per bundle and request size:

  gather: dtype=<d> b=<B> examples_per_core_s=<x> us_per_example=<u>
          table_mib=<t> vs_fp32=<x / the fp32 bundle's x at B>

vs_fp32 is "-" unless an fp32 bundle came first. With --fp16-astype an
fp16 bundle is also timed with NumPy's own float16 -> float32 cast
(astype) in place of dlrm.half_to_float32, as dtype=fp16-astype.

Run it with single-threaded math libraries (OMP_NUM_THREADS=1 and
friends), e.g. on bundles exported by
  recmesh export --max-vocab 13300 --seed 1 --table-dtype <d> --out DIR
(about 100 MB of float32 tables).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dlrm import EMBEDDING_DIM, NUM_TABLES, Embeddings, is_table, read_bundle  # noqa: E402


def rate(emb, batch, seconds, draws=64, seed=1):
    """Examples per CPU-second of this thread over about seconds."""
    rng = np.random.default_rng(seed)
    ids = [np.concatenate([rng.integers(0, v, (batch, h)) for v, h in zip(emb.vocab, emb.hotness)],
                          axis=1).astype(np.int32) for _ in range(draws)]
    pooled = np.empty((batch, NUM_TABLES, EMBEDDING_DIM), np.float32)
    for i in range(min(draws, 8)):
        emb.gather(ids[i], pooled)
    n, wall0, cpu0 = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - wall0 < seconds:
        emb.gather(ids[n % draws], pooled)
        n += 1
    return n * batch / (time.thread_time() - cpu0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", action="append", required=True, help="bundle directory (repeatable)")
    ap.add_argument("--batches", default="1,16,128", help="examples per call, comma-separated")
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per point")
    ap.add_argument("--cpu", type=int, default=-1, help="CPU to pin to (-1: the last allowed)")
    ap.add_argument("--fp16-astype", action="store_true", help="also time fp16 with NumPy's astype cast")
    args = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[-1] if args.cpu < 0 else args.cpu})
    batches = [int(b) for b in args.batches.split(",")]
    base = {}
    for bundle in args.bundle:
        config, tensors = read_bundle(bundle, want=is_table)
        emb = Embeddings(config, tensors)
        runs = [(emb.dtype, emb.dequantize)]
        if args.fp16_astype and emb.dtype == "fp16":
            runs.append(("fp16-astype", lambda rows: rows.view(np.float16).astype(np.float32)))
        for name, dequantize in runs:
            emb.dequantize = dequantize
            for b in batches:
                x = rate(emb, b, args.seconds)
                if name == "fp32":
                    base[b] = x
                vs = f"{x / base[b]:.2f}" if b in base else "-"
                print(f"gather: dtype={name} b={b} examples_per_core_s={x:.0f} us_per_example={1e6 / x:.2f} "
                      f"table_mib={emb.table_bytes / (1 << 20):.1f} vs_fp32={vs}", flush=True)
        del emb, tensors


if __name__ == "__main__":
    main()
