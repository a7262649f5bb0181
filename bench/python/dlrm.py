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
    whose name satisfies want: the dense tensors float32, the tables at the
    precision config.json's table_dtype stores them in (TABLE_LAYOUTS), each
    checked against it."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    if (len(config["hotness"]) != NUM_TABLES or len(config["vocab_sizes"]) != NUM_TABLES
            or config["num_dense"] != NUM_DENSE or config["embedding_dim"] != EMBEDDING_DIM):
        raise ValueError(f"{directory}: not the DLRMv2 input layout "
                         f"({NUM_TABLES} tables, {NUM_DENSE} dense, dimension {EMBEDDING_DIM})")
    try:
        dtype = table_dtype(config)
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
                np_dtype = "<f4"
                if info["dtype"] != "F32":
                    raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, want F32")
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
    """The dense weights as forward() takes them (NumPy arrays, shapes
    checked against config.json): {"bottom": [(w, b)], "cross": [(v, u,
    b)], "top": [(w, b)]}."""
    check_dense_shapes(config, tensors)

    def layers(prefix, count):
        return [(tensors[f"{prefix}.{i}.kernel"], tensors[f"{prefix}.{i}.bias"]) for i in range(count)]

    return {
        "bottom": layers("bottom_mlp", len(config["bottom_mlp"])),
        "cross": [(tensors[f"cross.{i}.v"], tensors[f"cross.{i}.u"], tensors[f"cross.{i}.bias"])
                  for i in range(config["cross_layers"])],
        "top": layers("top_mlp", len(config["top_mlp"])),
    }


def make_forward(jax, jnp):
    """The DCNv2 forward pass over dense_params, for jax.jit: scores for
    dense (B, 13) and pooled (B, 26, 128)."""
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


class DenseNetwork:
    """The DCNv2 dense network under jax.jit, one executable per bucket."""

    def __init__(self, config, tensors):
        import jax
        import jax.numpy as jnp

        # The weights are arguments of the jitted function, not closure
        # constants, so one copy serves every bucket's executable.
        self.params = jax.device_put(dense_params(config, tensors))
        self.forward = jax.jit(make_forward(jax, jnp))

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

