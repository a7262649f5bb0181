#!/usr/bin/env python3
"""NumPy baseline for the embedding lookup: gather + sum-pool on one core.

It holds the tables the way a Python model server would: one private
np.ndarray per table at the bundle's precision (config.json table_dtype),
copied out of the bundle's model.safetensors through numpy.memmap. Each
batch of B uniform random examples is pooled table by table: np.take
gathers the bag rows ((B, hotness, row bytes)), the rows are dequantized
to float32 as whole arrays (no loop per row), and a sum over the bag axis
writes into a preallocated (B, 26, 128) output, on one CPU pinned with
os.sched_setaffinity. The row layouts are model/dtype.go's: fp16 halves;
int8 128 codes then float32 scale and bias; int4 64 bytes of nibbles (low
first) then float16 scale and bias; value = code * scale + bias. (Gathering
into preallocated buffers instead, np.take(..., out=, mode="clip"),
measured slower here, so the baseline is the plain form.) Throughput is
examples per CPU-second of this thread (time.thread_time), the same
measure cmd/lookupbench reports for Go.

Run it with single-threaded math libraries (OMP_NUM_THREADS=1 and friends,
as `make bench-lookup` does). With --go-result, the JSON written by
lookupbench -json, it prints the comparison line last:

  lookup: examples_per_core_s=<go> numpy_examples_per_core_s=<numpy>
          ratio=<go/numpy> table_bytes=<n> huge_page_fraction=<f>
          dtype=<d> kernel=<k> vs_fp32=<go/go at fp32>

vs_fp32 needs --go-fp32-result, lookupbench's JSON for the float32 tables
of the same run; it is 1.00 for float32 itself and "-" without it.
"""

import argparse
import json
import os
import struct
import sys
import time

import numpy as np

DIM = 128

# The row layouts and the whole-array dequantization are the Python arms'
# own (bench/python/dlrm.py), so this baseline gathers exactly as they do.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from dlrm import DEQUANTIZE, TABLE_LAYOUTS  # noqa: E402


def dequantize(rows, dtype):
    """Float32 values of gathered stored rows, shape (..., 128)."""
    if dtype == "fp32":
        return rows
    return DEQUANTIZE[dtype](rows)


def load_tables(bundle):
    """Return (hotness, dtype, [private array of stored rows per table])."""
    with open(os.path.join(bundle, "config.json")) as f:
        cfg = json.load(f)
    dtype = cfg.get("table_dtype") or "fp32"
    if dtype not in TABLE_LAYOUTS:
        sys.exit(f"lookup_bench: {bundle}: table_dtype {dtype!r} is not one of {', '.join(TABLE_LAYOUTS)}")
    st_dtype, np_dtype, width = TABLE_LAYOUTS[dtype]
    path = os.path.join(bundle, "model.safetensors")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data_start = 8 + header_len
    tables = []
    for i, vocab in enumerate(cfg["vocab_sizes"]):
        meta = header[f"embedding.{i}.weight"]
        if meta["dtype"] != st_dtype or meta["shape"] != [vocab, width]:
            sys.exit(f"lookup_bench: table {i}: {meta['dtype']} {meta['shape']}, "
                     f"want {st_dtype} {[vocab, width]} for {dtype}")
        begin, _ = meta["data_offsets"]
        view = np.memmap(path, dtype=np_dtype, mode="r", offset=data_start + begin, shape=(vocab, width))
        table = np.array(view)  # a private copy, like a server's own arrays
        # fp16 rows are gathered as their bits, which dlrm's dequantize_fp16
        # widens (a view: the same memory).
        tables.append(table.view(np.int16) if dtype == "fp16" else table)
        del view
    return cfg["hotness"], dtype, tables


def pin(cpu):
    """Pin this process to one CPU (the last allowed one when cpu < 0)."""
    allowed = sorted(os.sched_getaffinity(0))
    if cpu < 0:
        cpu = allowed[-1]
    os.sched_setaffinity(0, {cpu})
    return cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="bundle directory")
    ap.add_argument("--batch", type=int, default=128, help="examples per batch")
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    ap.add_argument("--batches", type=int, default=64, help="distinct random id batches")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cpu", type=int, default=-1, help="CPU to pin to (-1: the last allowed)")
    ap.add_argument("--go-result", help="lookupbench JSON result: print the comparison line")
    ap.add_argument("--go-fp32-result", help="lookupbench JSON result on the float32 tables: print vs_fp32")
    args = ap.parse_args()

    cpu = pin(args.cpu)
    start = time.perf_counter()
    hotness, dtype, tables = load_tables(args.bundle)
    table_bytes = sum(t.nbytes for t in tables)
    print(f"numpy: loaded {len(tables)} tables ({table_bytes} bytes) in "
          f"{time.perf_counter() - start:.1f}s", file=sys.stderr)

    # Ids per table, [batches, B, hotness], as the platform's index type so
    # np.take does not convert them on every call.
    rng = np.random.default_rng(args.seed)
    B = args.batch
    ids = [rng.integers(0, t.shape[0], size=(args.batches, B, h), dtype=np.intp)
           for t, h in zip(tables, hotness)]
    out = np.empty((B, len(tables), DIM), dtype=np.float32)

    def pool(b):
        for t, table in enumerate(tables):
            dequantize(np.take(table, ids[t][b], axis=0), dtype).sum(axis=1, out=out[:, t, :])

    b = 0
    end = time.perf_counter() + args.warmup
    while time.perf_counter() < end:
        pool(b)
        b = (b + 1) % args.batches

    examples = 0
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    end = wall0 + args.duration
    while time.perf_counter() < end:
        pool(b)
        b = (b + 1) % args.batches
        examples += B
    cpu_s, wall_s = time.thread_time() - cpu0, time.perf_counter() - wall0
    per_core = examples / cpu_s
    print(f"numpy: {dtype} tables, B={B} on cpu {cpu}: {examples} examples in {cpu_s:.2f}s cpu / "
          f"{wall_s:.2f}s wall: {per_core:.0f} examples per core-second "
          f"({1e6 / per_core:.2f} µs per example)", file=sys.stderr)

    if args.go_result:
        with open(args.go_result) as f:
            go = json.load(f)
        x = go["examples_per_core_s"]
        if go.get("dtype", "fp32") != dtype:
            sys.exit(f"lookup_bench: {args.go_result} measured {go.get('dtype')} tables, this run {dtype}")
        vs = "-"
        if args.go_fp32_result:
            with open(args.go_fp32_result) as f:
                base = json.load(f)
            if base.get("dtype", "fp32") != "fp32":
                sys.exit(f"lookup_bench: {args.go_fp32_result} measured {base.get('dtype')} tables, not fp32")
            vs = f"{x / base['examples_per_core_s']:.2f}"
        print(f"lookup: examples_per_core_s={x:.0f} numpy_examples_per_core_s={per_core:.0f} "
              f"ratio={x / per_core:.2f} table_bytes={go['table_bytes']} "
              f"huge_page_fraction={go['huge_page_fraction']:.3f} "
              f"dtype={dtype} kernel={go['kernel']} vs_fp32={vs}")
    else:
        print(f"numpy: examples_per_core_s={per_core:.0f}")


if __name__ == "__main__":
    main()
