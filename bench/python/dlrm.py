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

NumPy is imported at the top; JAX only by DenseNetwork, so a process that
only gathers (a py-mp frontend) never loads it.
"""

import json
import os
import struct
import time

import numpy as np

from layout import EMBEDDING_DIM, NUM_DENSE, NUM_TABLES


def read_bundle(directory, want=lambda name: True):
    """Returns (config dict, {tensor name: private float32 ndarray}) for the
    tensors whose name satisfies want."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    if (len(config["hotness"]) != NUM_TABLES or len(config["vocab_sizes"]) != NUM_TABLES
            or config["num_dense"] != NUM_DENSE or config["embedding_dim"] != EMBEDDING_DIM):
        raise ValueError(f"{directory}: not the DLRMv2 input layout "
                         f"({NUM_TABLES} tables, {NUM_DENSE} dense, dimension {EMBEDDING_DIM})")
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


def is_table(name):
    return name.startswith("embedding.")


class Embeddings:
    """The 26 tables, the id check and the NumPy gather."""

    def __init__(self, config, tensors):
        self.hotness = list(config["hotness"])
        self.vocab = list(config["vocab_sizes"])
        self.width = sum(self.hotness)
        self.offsets = [sum(self.hotness[:t]) for t in range(NUM_TABLES)]
        # The exclusive upper bound of every id column, for one vectorised
        # range check per request.
        self.limits = np.repeat(np.asarray(self.vocab, dtype=np.int64), self.hotness)
        self.tables = [tensors[f"embedding.{t}.weight"] for t in range(NUM_TABLES)]
        for t, table in enumerate(self.tables):
            if table.shape != (self.vocab[t], EMBEDDING_DIM):
                raise ValueError(f"embedding.{t}.weight has shape {table.shape}, "
                                 f"want ({self.vocab[t]}, {EMBEDDING_DIM})")

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
        (>= B, 26, 128) float32 buffer): one take + sum per table."""
        b = sparse.shape[0]
        for t, table in enumerate(self.tables):
            off, h = self.offsets[t], self.hotness[t]
            np.take(table, sparse[:, off:off + h], axis=0).sum(axis=1, out=pooled[:b, t])


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

