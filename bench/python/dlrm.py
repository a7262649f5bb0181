"""The DLRM-DCNv2 model of the Python arms: the bundle, the NumPy embedding
lookups and the jitted dense network.

The math is model/reference.go's: bottom MLP with ReLU after every layer;
x0 = concat(bottom output, 26 pooled vectors); cross layers
x_{l+1} = x0 * ((x_l @ V_l) @ U_l + b_l) + x_l; top MLP with ReLU after
every layer but the last; sigmoid. The layer widths, the cross layer count
and rank are whatever config.json says (the weights' shapes follow them);
only the input layout (26 tables, 13 dense features, dimension 128) is
fixed, since the protocol's tensors are. Weights are stored [in, out] in the
bundle's model.safetensors, which is parsed here (an 8-byte little-endian
header length, a JSON header, then the data) and read into private memory.

The embedding tables are held at the precision the bundle stores them in
(config.json's table_dtype: fp32, fp16, int8 or int4; model/dtype.go is the
one statement of the row layouts) and dequantized on the gather, whole
gathered arrays at a time, never a Python loop per row: value = float32(q) *
scale + bias, each operation rounded to float32 as the Go kernels do, and a
pooled vector is the float32 sum of its bag's values.

The dense parameters are held at the precision the bundle stores them in
(config.json's dense_dtype: fp32, or fp16 and bf16 halves, whose values
are their exact widenings to float32), and the network computes in float32
whatever it is: --dense-compute (DENSE_COMPUTE) chooses between half
weights on the device (half), float32 ones widened at load (fp32) and, the
default, per bucket whichever of the two was measured faster (auto; see
HALF_PLAN for the formulations and the figures).

NumPy is imported at the top; JAX only by DenseNetwork, so a process that
only gathers (a py-mp frontend) never loads it.
"""

import json
import os
import struct
import time

import numpy as np

from layout import EMBEDDING_DIM, NUM_DENSE, NUM_TABLES


# The stored row of each table precision (model/dtype.go): the safetensors
# dtype, the NumPy dtype the table is held in, and the row's width in those
# elements.
TABLE_LAYOUTS = {
    "fp32": ("F32", "<f4", EMBEDDING_DIM),
    "fp16": ("F16", "<f2", EMBEDDING_DIM),
    # 128 uint8 codes, then float32 scale and bias.
    "int8": ("U8", "u1", EMBEDDING_DIM + 8),
    # 64 bytes of nibbles (element j in byte j/2, low nibble first), then
    # float16 scale and bias.
    "int4": ("U8", "u1", EMBEDDING_DIM // 2 + 4),
}


# The stored dense parameters of each dense precision (config.json's
# dense_dtype): the safetensors dtype and the NumPy dtype they are held in.
# A stored half's value is its exact widening to float32; the model computes
# in float32 all the same (see make_forward). NumPy has no bfloat16: BF16
# tensors are read as their uint16 bits and viewed as ml_dtypes.bfloat16
# (JAX's own bfloat16 type; imported only when such a tensor is read, so a
# process that only gathers never loads it).
DENSE_LAYOUTS = {
    "fp32": ("F32", "<f4"),
    "fp16": ("F16", "<f2"),
    "bf16": ("BF16", "<u2"),
}


def dense_dtype(config):
    """The precision config.json stores the dense parameters in (absent or
    empty: fp32, what a bundle written before dense precisions holds)."""
    dtype = config.get("dense_dtype") or "fp32"
    if dtype not in DENSE_LAYOUTS:
        raise ValueError(f"config.json: dense_dtype {dtype!r} is not one of {', '.join(DENSE_LAYOUTS)}")
    return dtype


def table_dtype(config):
    """The precision config.json stores the tables in (absent: fp32, what a
    bundle written before precisions holds)."""
    dtype = config.get("table_dtype") or "fp32"
    if dtype not in TABLE_LAYOUTS:
        raise ValueError(f"config.json: table_dtype {dtype!r} is not one of {', '.join(TABLE_LAYOUTS)}")
    return dtype


def table_index(name):
    """The table number of a tensor named embedding.<t>.weight, else None."""
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "embedding" and parts[2] == "weight" and parts[1].isdigit():
        t = int(parts[1])
        if t < NUM_TABLES:
            return t
    return None


def read_bundle(directory, want=lambda name: True):
    """Returns (config dict, {tensor name: private ndarray}) for the tensors
    whose name satisfies want: the dense tensors at the precision
    config.json's dense_dtype stores them in (DENSE_LAYOUTS: float32,
    float16 or ml_dtypes.bfloat16), the tables at the precision its
    table_dtype stores them in (TABLE_LAYOUTS), each checked against it."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    if (len(config["hotness"]) != NUM_TABLES or len(config["vocab_sizes"]) != NUM_TABLES
            or config["num_dense"] != NUM_DENSE or config["embedding_dim"] != EMBEDDING_DIM):
        raise ValueError(f"{directory}: not the DLRMv2 input layout "
                         f"({NUM_TABLES} tables, {NUM_DENSE} dense, dimension {EMBEDDING_DIM})")
    try:
        dtype = table_dtype(config)
        ddtype = dense_dtype(config)
    except ValueError as e:
        raise ValueError(f"{directory}: {e}") from None
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
            if name == "__metadata__" or not want(name):
                continue
            shape = tuple(info["shape"])
            if is_table(name):
                t = table_index(name)
                if t is None:
                    raise ValueError(f"{path}: tensor {name} is not one of the {NUM_TABLES} tables embedding.<t>.weight")
                st_dtype, np_dtype, width = TABLE_LAYOUTS[dtype]
                said = f" (config.json says table_dtype {dtype})"
                if info["dtype"] != st_dtype:
                    raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, want {st_dtype}{said}")
                if shape != (config["vocab_sizes"][t], width):
                    raise ValueError(f"{path}: tensor {name} has shape {list(shape)}, "
                                     f"want {[config['vocab_sizes'][t], width]}{said}")
            else:
                st_dtype, np_dtype = DENSE_LAYOUTS[ddtype]
                if info["dtype"] != st_dtype:
                    raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, want {st_dtype} "
                                     f"(config.json says dense_dtype {ddtype})")
            begin, end = info["data_offsets"]
            arr = np.empty(shape, dtype=np_dtype)
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
            if info["dtype"] == "BF16":
                import ml_dtypes

                arr = arr.view(ml_dtypes.bfloat16)
            tensors[name] = arr
    return config, tensors


def is_table(name):
    return name.startswith("embedding.")


# float32(2**112): scales a float16's exponent field, moved into a float32's
# (bias 15 to bias 127), back to the half's value.
_HALF_SCALE = np.float32(2.0 ** 112)
# The float32 sign bit and the fields of a half shifted left by 13 (its
# exponent and mantissa), as int32: 0x8FFFE000.
_HALF_MASK = np.int32(-0x70002000)


def half_to_float32(rows):
    """The float32 values of float16 rows given as their int16 bit patterns
    (any shape): exactly what astype(np.float32) gives for every finite half,
    subnormals and signed zeros included, in four whole-array passes.
    NumPy's own float16 to float32 cast is a scalar loop here, 2-3x slower
    than this on large arrays (bench/python/gather_bench.py --fp16-astype
    measures both), though faster on small ones (_HALF_CAST_BELOW). The bits
    are sign-extended to int32 and shifted left by 13, which puts the
    sign in bit 31 (copies of it in bits 28-30, masked off) and the
    exponent and mantissa where a float32's low exponent bits and mantissa
    are: that float32 is the half's value times 2**-112 (a float32
    subnormal for a half subnormal), and the multiply by 2**112 is exact.
    Tables hold no infinities or NaNs (the exporter refuses them)."""
    x = rows.astype(np.int32)
    np.left_shift(x, 13, out=x)
    np.bitwise_and(x, _HALF_MASK, out=x)
    v = x.view(np.float32)
    np.multiply(v, _HALF_SCALE, out=v)
    return v


# The float32 values of the two 4-bit codes of every byte, low nibble
# (the even element) first: one gather unpacks a whole array of int4 rows.
_NIBBLES = np.stack([np.arange(256) & 0xF, np.arange(256) >> 4], axis=1).astype(np.float32)


# Below this many halves NumPy's astype, one call, beats half_to_float32's
# four (measured: even at 16 rows, 2.2 µs against 2.3; 3.6x slower at 1,
# 2x faster at 128). Both give the same bits.
_HALF_CAST_BELOW = 2048


def dequantize_fp16(rows):
    """Gathered fp16 rows (..., 128), held as int16 bits -> float32 values."""
    if rows.size < _HALF_CAST_BELOW:
        return rows.view(np.float16).astype(np.float32)
    return half_to_float32(rows)


def dequantize_int8(rows):
    """Gathered int8 rows (..., 136) uint8 -> float32 values (..., 128):
    q * scale + bias, the scale and bias read in place as the float32 words
    32 and 33 of each row (136 bytes are 34 words)."""
    words = rows.view("<f4")
    v = rows[..., :EMBEDDING_DIM].astype(np.float32)
    w = EMBEDDING_DIM // 4
    np.multiply(v, words[..., w:w + 1], out=v)
    np.add(v, words[..., w + 1:w + 2], out=v)
    return v


def dequantize_int4(rows):
    """Gathered int4 rows (..., 68) uint8 -> float32 values (..., 128): the
    nibbles unpacked by one gather from _NIBBLES (byte j/2 holds element j
    in its low nibble for even j, its high nibble for odd j), then
    q * scale + bias, the float16 scale and bias (halves 32 and 33 of each
    row) widened to float32."""
    half = EMBEDDING_DIM // 2
    sb = rows.view("<f2")[..., half // 2:half // 2 + 2].astype(np.float32)
    v = np.take(_NIBBLES, rows[..., :half], axis=0).reshape(rows.shape[:-1] + (EMBEDDING_DIM,))
    np.multiply(v, sb[..., 0:1], out=v)
    np.add(v, sb[..., 1:2], out=v)
    return v


# Each quantized precision's dequantization of gathered rows (fp32 needs
# none).
DEQUANTIZE = {"fp16": dequantize_fp16, "int8": dequantize_int8, "int4": dequantize_int4}


class Embeddings:
    """The 26 tables, the id check and the NumPy gather. The tables stay at
    the bundle's precision; a quantized gather dequantizes the rows it took
    (whole arrays, see DEQUANTIZE) before the bag's float32 sum."""

    def __init__(self, config, tensors):
        self.hotness = list(config["hotness"])
        self.vocab = list(config["vocab_sizes"])
        self.width = sum(self.hotness)
        self.offsets = [sum(self.hotness[:t]) for t in range(NUM_TABLES)]
        # The exclusive upper bound of every id column, for one vectorised
        # range check per request.
        self.limits = np.repeat(np.asarray(self.vocab, dtype=np.int64), self.hotness)
        self.dtype = table_dtype(config)
        st_dtype, np_dtype, row = TABLE_LAYOUTS[self.dtype]
        self.tables = [tensors[f"embedding.{t}.weight"] for t in range(NUM_TABLES)]
        for t, table in enumerate(self.tables):
            if table.shape != (self.vocab[t], row) or table.dtype != np.dtype(np_dtype):
                raise ValueError(f"embedding.{t}.weight is {table.dtype} {table.shape}, "
                                 f"want {np.dtype(np_dtype)} ({self.vocab[t]}, {row}) for table_dtype {self.dtype}")
        if self.dtype == "fp16":
            # Gathered as their bits, which half_to_float32 widens (views:
            # the same memory).
            self.tables = [t.view(np.int16) for t in self.tables]
        self.dequantize = DEQUANTIZE.get(self.dtype)
        self.table_bytes = sum(t.nbytes for t in self.tables)

    def check_ids(self, sparse):
        """Returns an error message when an id is outside its table."""
        bad = (sparse < 0) | (sparse >= self.limits)
        if not bad.any():
            return None
        e, col = (int(i) for i in np.argwhere(bad)[0])
        table = int(np.searchsorted(self.offsets, col, side="right")) - 1
        return f"example {e}: id {int(sparse[e, col])} of table {table} outside [0, {self.vocab[table]})"

    def gather(self, sparse, pooled):
        """Sum-pools validated ids sparse (B, width) into pooled[:B] (a
        (>= B, 26, 128) float32 buffer): per table one take of the stored
        rows, their dequantization (quantized tables) and one sum."""
        b = sparse.shape[0]
        dequantize = self.dequantize
        if dequantize is None:
            for t, table in enumerate(self.tables):
                off, h = self.offsets[t], self.hotness[t]
                np.take(table, sparse[:, off:off + h], axis=0).sum(axis=1, out=pooled[:b, t])
            return
        for t, table in enumerate(self.tables):
            off, h = self.offsets[t], self.hotness[t]
            dequantize(np.take(table, sparse[:, off:off + h], axis=0)).sum(axis=1, out=pooled[:b, t])


class BucketBuffers:
    """One thread's padded (dense, pooled) input buffers, one pair per
    bucket. Rows past a batch keep an earlier batch's values: finite, since
    only validated inputs are ever written, and their scores are dropped."""

    def __init__(self):
        self.bufs = {}

    def get(self, bucket):
        if bucket not in self.bufs:
            self.bufs[bucket] = (np.zeros((bucket, NUM_DENSE), np.float32),
                                 np.zeros((bucket, NUM_TABLES, EMBEDDING_DIM), np.float32))
        return self.bufs[bucket]


def check_dense_shapes(config, tensors):
    """Checks that the dense tensors have the shapes config.json's
    bottom_mlp, cross_layers, cross_rank and top_mlp give them."""
    want = {}
    width = NUM_DENSE
    for i, out in enumerate(config["bottom_mlp"]):
        want[f"bottom_mlp.{i}.kernel"], want[f"bottom_mlp.{i}.bias"] = (width, out), (out,)
        width = out
    width += NUM_TABLES * EMBEDDING_DIM
    rank = config["cross_rank"]
    for i in range(config["cross_layers"]):
        want[f"cross.{i}.v"], want[f"cross.{i}.u"], want[f"cross.{i}.bias"] = (width, rank), (rank, width), (width,)
    for i, out in enumerate(config["top_mlp"]):
        want[f"top_mlp.{i}.kernel"], want[f"top_mlp.{i}.bias"] = (width, out), (out,)
        width = out
    if width != 1:
        raise ValueError(f"top_mlp ends with width {width}, want 1 (the score)")
    for name, shape in want.items():
        if name not in tensors:
            raise ValueError(f"model.safetensors has no tensor {name}")
        if tensors[name].shape != shape:
            raise ValueError(f"tensor {name} has shape {tensors[name].shape}, config.json gives {shape}")


def dense_params(config, tensors):
    """The dense weights as the bundle stores them (NumPy arrays at its
    dense_dtype, [in, out], shapes checked against config.json):
    {"bottom": [(w, b)], "cross": [(v, u, b)], "top": [(w, b)]}; what the
    jitted forward takes is device_dense_params' (for a float32 bundle, the
    same arrays)."""
    check_dense_shapes(config, tensors)

    def layers(prefix, count):
        return [(tensors[f"{prefix}.{i}.kernel"], tensors[f"{prefix}.{i}.bias"]) for i in range(count)]

    return {
        "bottom": layers("bottom_mlp", len(config["bottom_mlp"])),
        "cross": [(tensors[f"cross.{i}.v"], tensors[f"cross.{i}.u"], tensors[f"cross.{i}.bias"])
                  for i in range(config["cross_layers"])],
        "top": layers("top_mlp", len(config["top_mlp"])),
    }


# How the network computes with half-precision (fp16, bf16) weights. A
# stored half's value is its exact widening to float32, and every product,
# sum and activation is float32: half weights save bytes, not math. Off a
# CPU, XLA fuses a weight's convert into the matmul that reads it, so the
# program is the plain one, jnp.dot(x, w.astype(float32)). XLA's CPU
# backends have no matmul that reads halves: for that program they
# materialise the float32 copy of every weight (64 MB for MLPerf's
# network) on every call, into freshly mapped memory whose page faults make
# it 4-8x slower than float32 weights at small buckets
# (lax.dot_general(x, w, preferred_element_type=float32) compiles to the
# same; measured). What is fast on a CPU depends on the batch size, so each
# bucket's executable (jit traces one per batch size) computes the way a
# plan gives it, from the copies of the weights the plan holds (see
# FORMULATIONS below). Measured on the 2-core Xeon (Sapphire Rapids, KVM)
# this was written on, MLPerf's dense network (the same in
# data/dlrm-cap1000 and dlrm-cap850000), examples/s, medians of 5
# interleaved rounds of 0.3 s (the machine's speed drifts by minutes:
# compare within a column), one XLA thread:
#
#   jaxlib 0.10.2 CPU      b=1     2     4     8    16    32    64   128   256   512  1024
#   float32 weights        260   352   444   720  1149  1510  2768  3323  3835  4095  3751
#   fp16, HALF_PLAN        576   638  1097  1532  2006  2393  2983  3394  3671  3261  3460
#   bf16, HALF_PLAN        561   628  1068  1486  1949  2373  2945  3378  3631  3197  3463
#   fp16, auto (1 thread)  567   628  1078  1497  1933  2348  2963  3410  3650  4006  3708
#   fp16, plain (whole)     30    58   108   201   371   645  1247  1934  2661  3224  3487
#
#   recmesh's PJRT plugin  b=1     2    16    32    64   128   512
#   float32 weights        314   397  1356  2285  3993  4361  4502
#   fp16, PLUGIN_HALF_PLAN 554   573  2236  2824  3269  4010  4466
#   bf16, PLUGIN_HALF_PLAN 578   572  2290  2895  3302  4026  4557
#   fp16, plain (whole)     14   264  1531  2382  3332  3999  4574
#
# and with XLA's pool of 2 threads (jaxlib, taskset -c 0,1): float32 404,
# 700, 2013, 5604, 7800 at b=1, 2, 16, 128, 512; HALF_PLAN 821, 332, 1464,
# 3500, 6153 (the chunked loops' small matmuls do not share out well);
# auto (AUTO_PLAN_THREADS) 775, 674, 2019, 5643, 7615. Half weights pay
# where the weights' bytes dominate (small buckets, one thread); at large
# buckets the matmuls' arithmetic does and float32 weights are as fast or
# faster. Scores of every plan are within 3e-7 (relative) of the float32
# program on the widened weights (fp16 and bf16, b = 1 ... 512).
#
# On an H200 (jax 0.11.2, CUDA), the plain program with half weights
# against the same with float32 weights, examples/s, b = 1, 16, 128, 1024:
# fp16 1764/1545, 28347/27910, 169162/174840, 610137/661988; bf16
# 1857/1716, 28353/28335, 187910/209606, 729867/773204 (float32 against
# itself varied by 15 % at 128): a wash, so off a CPU every --dense-compute
# but fp32 runs the half weights in the plain program.
#
# A plan is a tuple of (largest bucket, or None for every larger one,
# formulation), read in order; a formulation is one of
#
#   gemv   the transposed halves ([out, in]), jnp.dot(x, widen(w_t).T):
#          XLA fuses the convert into the matrix-vector product, which
#          then streams the halves once and nothing else (b = 1 only: for
#          a matrix it materialises the float32 copy);
#   rows   the halves as stored ([in, out]) in chunks of input rows of
#          chunk_bytes of float32 each, a lax.fori_loop: each chunk is
#          widened into a buffer that stays in the L2 cache and multiplied,
#          the partial products summed in float32;
#   cols   the transposed halves in chunks of output columns (chunk_bytes
#          of float32 each): full-depth matmuls, each into its own columns
#          of the result;
#   whole  jnp.dot(x, w.astype(float32)), the float32 copy of each weight
#          made on every call (what XLA does with the plain program);
#   fp32   a float32 copy of the weights widened at load: the float32
#          program.
#
# CHUNK_BYTES is an eighth of the 4 MiB L2 (one thread: 512 KiB and 1 MiB
# alike, 2 MiB 20-40 % slower, 8 MiB up to 8x slower). On a CPU, bf16 weights
# are held as their uint16 bits and widened by a shift (u << 16 is the
# float32): XLA's CPU backend computes bf16 operations in float32, which
# hoists a bf16 convert out of the chunk loop (one whole float32 copy
# again), and a bf16 -> uint16 bitcast of a parameter is a copy there too.
# A plan holds every copy one of its formulations reads: HALF_PLAN the two
# half layouts (together the bytes of one float32 copy), the auto plans a
# float32 copy as well.
CHUNK_BYTES = 512 << 10
FORMULATIONS = ("gemv", "rows", "cols", "whole", "fp32")
# --dense-compute half on jaxlib's CPU backend, and on recmesh's PJRT
# plugin (jaxbench.py --backend plugin, a newer XLA): half weights only.
HALF_PLAN = ((1, "gemv"), (32, "rows"), (256, "cols"), (None, "whole"))
PLUGIN_HALF_PLAN = ((1, "gemv"), (32, "rows"), (None, "whole"))
# --dense-compute auto: per bucket the faster of the half formulations and
# float32 weights, with XLA's one thread (--xla-threads 1, or one usable
# CPU) and with its intra-op pool of several.
AUTO_PLAN_ONE_THREAD = ((1, "gemv"), (32, "rows"), (256, "cols"), (None, "fp32"))
AUTO_PLAN_THREADS = ((1, "gemv"), (None, "fp32"))

# --dense-compute: auto (the default) runs each bucket the faster way (a
# plan above, holding the half copies it reads and a float32 one); half
# keeps only half weights on the device; fp32 widens them at load and runs
# the float32 program. A float32 bundle runs the float32 program whatever
# the choice.
DENSE_COMPUTE = ("auto", "half", "fp32")


def dense_plan(config, compute="auto", platform="cpu", threads=1, backend="jaxlib"):
    """The plan (see FORMULATIONS) a network runs, or None for the plain
    program over plain arrays: float32 weights (a float32 bundle, compute
    fp32), or half weights off a CPU, where XLA fuses their convert into
    the matmul (jnp.dot(x, w.astype(float32)) at every bucket). threads is
    XLA's intra-op threads; backend, on a CPU, jaxlib or plugin (recmesh's
    PJRT plugin, whose newer XLA wants PLUGIN_HALF_PLAN)."""
    if compute not in DENSE_COMPUTE:
        raise ValueError(f"dense compute {compute!r} is not one of {', '.join(DENSE_COMPUTE)}")
    if dense_dtype(config) == "fp32" or compute == "fp32" or platform != "cpu":
        return None
    if compute == "half":
        return PLUGIN_HALF_PLAN if backend == "plugin" else HALF_PLAN
    return AUTO_PLAN_ONE_THREAD if threads <= 1 else AUTO_PLAN_THREADS


def plan_for(plan, bucket):
    """The formulation plan gives a batch of bucket examples."""
    for most, how in plan:
        if most is None or bucket <= most:
            return how
    raise ValueError(f"plan {plan} covers no bucket {bucket}")


def _divisor_at_most(n, most):
    """The largest divisor of n that is at most max(most, 1)."""
    most = max(min(most, n), 1)
    return max(d for d in range(1, most + 1) if n % d == 0)


def device_dense_params(config, tensors, compute="auto", plan=None):
    """The dense parameters as make_forward(plan)'s forward takes them
    (NumPy arrays, for jax.device_put), in dense_params' structure. With no
    plan, plain arrays: float32 (a float32 bundle, or compute fp32: the
    halves widened, exactly) or the halves as stored (float16,
    ml_dtypes.bfloat16). With a plan, a dict per matrix holding the copies
    its formulations read: "kn" the halves as stored [in, out], "nk" the
    halves transposed [out, in], "f32" widened; and per bias "half" and/or
    "f32". On a plan's CPU, bf16 halves are held as their uint16 bits,
    widened by a shift (see make_forward)."""
    params = dense_params(config, tensors)
    half = dense_dtype(config) != "fp32" and compute != "fp32"

    def f32(a):
        # Exact: every float16 and bfloat16 is a float32.
        return np.asarray(a, dtype=np.float32)

    if plan is None:
        def plain(a):
            return a if half else f32(a)

        return {
            "bottom": [(plain(w), plain(b)) for w, b in params["bottom"]],
            "cross": [(plain(v), plain(u), plain(b)) for v, u, b in params["cross"]],
            "top": [(plain(w), plain(b)) for w, b in params["top"]],
        }
    uses = {how for _, how in plan}

    def bits(a):
        return a if a.dtype == np.float16 else a.view(np.uint16)

    def vector(b):
        out = {"f32": f32(b)} if "fp32" in uses else {}
        if uses - {"fp32"}:
            out["half"] = bits(b)
        return out

    def matrix(w):
        out = {"f32": f32(w)} if "fp32" in uses else {}
        if uses & {"rows", "whole"}:
            out["kn"] = bits(w)
        if uses & {"gemv", "cols"}:
            out["nk"] = np.ascontiguousarray(bits(w).T)
        return out

    return {
        "bottom": [(matrix(w), vector(b)) for w, b in params["bottom"]],
        "cross": [(matrix(v), matrix(u), vector(b)) for v, u, b in params["cross"]],
        "top": [(matrix(w), vector(b)) for w, b in params["top"]],
    }


def describe_plan(config, plan, params):
    """A few words on a network's weights and program, for the logs."""
    w = params["top"][0][0]
    if plan is None:
        if w.dtype == np.float32:
            return "float32 weights"
        return f"{w.dtype} weights, float32 math (converted in the matmul)"
    held = ", ".join(f"{k} {v.dtype}" for k, v in w.items())
    return f"{dense_dtype(config)} bundle, copies held: {held}; float32 math; plan {plan}"


def make_forward(jax, jnp, plan=None, chunk_bytes=None):
    """The DCNv2 forward pass over device_dense_params(plan), for jax.jit:
    scores for dense (B, 13) and pooled (B, 26, 128). Without a plan, the
    plain program (with half weights, jnp.dot(x, w.astype(float32))); with
    one, each bucket's executable (jit traces one per batch size) computes
    every product the way the plan gives its batch size. Every product and
    sum is float32 either way: a half weight's value is its widening."""
    hi = jax.lax.Precision.HIGHEST
    lax = jax.lax
    f32 = jnp.float32
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    for _, how in plan or ():
        if how not in FORMULATIONS:
            raise ValueError(f"plan {plan}: {how!r} is not one of {', '.join(FORMULATIONS)}")

    def widen(w):
        if w.dtype == f32:
            return w
        if w.dtype == jnp.uint16:  # bfloat16 bits: the float32 is u << 16
            return lax.bitcast_convert_type(w.astype(jnp.uint32) << 16, f32)
        return w.astype(f32)

    def rows(x, w):
        # [in, out] halves: the sum over chunks of input rows of x_c @ widen(w_c).
        k, n = w.shape
        r = _divisor_at_most(k, chunk_bytes // (4 * n))
        if r == k:
            return jnp.dot(x, widen(w), precision=hi)

        def body(i, acc):
            xc = lax.dynamic_slice_in_dim(x, i * r, r, axis=1)
            wc = lax.dynamic_slice_in_dim(w, i * r, r, axis=0)
            return acc + jnp.dot(xc, widen(wc), precision=hi)

        return lax.fori_loop(0, k // r, body, jnp.zeros((x.shape[0], n), f32))

    def cols(x, wt):
        # [out, in] halves: every chunk of output columns is x @ widen(wt_c).T.
        n, k = wt.shape
        r = _divisor_at_most(n, chunk_bytes // (4 * k))
        if r == n:
            return jnp.dot(x, widen(wt).T, precision=hi)

        def body(i, y):
            wc = lax.dynamic_slice_in_dim(wt, i * r, r, axis=0)
            return lax.dynamic_update_slice_in_dim(y, jnp.dot(x, widen(wc).T, precision=hi), i * r, axis=1)

        return lax.fori_loop(0, n // r, body, jnp.zeros((x.shape[0], n), f32))

    def affine(x, w, b=None):
        """x @ w (+ b)."""
        if not isinstance(w, dict):
            y = jnp.dot(x, widen(w), precision=hi)
            return y if b is None else y + widen(b)
        how = plan_for(plan, x.shape[0])
        if how == "fp32":
            y = jnp.dot(x, w["f32"], precision=hi)
            return y if b is None else y + b["f32"]
        if how == "gemv":
            y = jnp.dot(x, widen(w["nk"]).T, precision=hi)
        elif how == "rows":
            y = rows(x, w["kn"])
        elif how == "cols":
            y = cols(x, w["nk"])
        else:
            y = jnp.dot(x, widen(w["kn"]), precision=hi)
        # The bias widened in the program too: with a float32 bias XLA
        # fuses the add into gemv's dot, and that fusion materialises the
        # float32 transposed weights (measured: 10x slower at bucket 1).
        return y if b is None else y + widen(b["half"])

    def forward(params, dense, pooled):
        x = dense
        for w, b in params["bottom"]:
            x = jax.nn.relu(affine(x, w, b))
        x0 = jnp.concatenate([x, pooled.reshape(pooled.shape[0], -1)], axis=1)
        xl = x0
        for v, u, b in params["cross"]:
            xl = x0 * affine(affine(xl, v), u, b) + xl
        y = xl
        last = len(params["top"]) - 1
        for i, (w, b) in enumerate(params["top"]):
            y = affine(y, w, b)
            if i < last:
                y = jax.nn.relu(y)
        return jax.nn.sigmoid(y[:, 0])

    return forward


class DenseNetwork:
    """The DCNv2 dense network under jax.jit, one executable per bucket, on
    JAX's default device. compute is --dense-compute (DENSE_COMPUTE),
    threads the XLA intra-op threads (which pick the auto plan)."""

    def __init__(self, config, tensors, compute="auto", threads=1):
        import jax
        import jax.numpy as jnp

        plan = dense_plan(config, compute, jax.devices()[0].platform, threads)
        params = device_dense_params(config, tensors, compute, plan)
        self.description = describe_plan(config, plan, params)
        # The weights are arguments of the jitted function, not closure
        # constants, so one copy serves every bucket's executable.
        self.params = jax.device_put(params)
        self.forward = jax.jit(make_forward(jax, jnp, plan))

    def __call__(self, dense, pooled):
        """Scores for a bucket: dense (bucket, 13), pooled (bucket, 26, 128)."""
        return np.asarray(self.forward(self.params, dense, pooled))

    def warm_up(self, largest, log):
        """Compiles and runs every bucket 1, 2, 4, ... up to largest."""
        rng = np.random.default_rng(0)
        bucket = 1
        while bucket <= largest:
            t0 = time.monotonic()
            self(rng.random((bucket, NUM_DENSE), dtype=np.float32),
                 rng.random((bucket, NUM_TABLES, EMBEDDING_DIM), dtype=np.float32))
            log.info("bucket %d compiled in %.2f s", bucket, time.monotonic() - t0)
            bucket *= 2

