"""Tests of dlrm.py's dense precisions: the bundle reader and every plan of
the jitted network against the float32 program on the widened weights.

  .deps/bench-venv/bin/python -m unittest discover -s bench/python -p 'test_*.py'

They write small bundles of their own (the DLRMv2 input layout, a tiny
dense network), so they need neither Go nor data/.
"""

import json
import os
import struct
import tempfile
import unittest

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dlrm  # noqa: E402
from layout import EMBEDDING_DIM, NUM_DENSE, NUM_TABLES  # noqa: E402

CONFIG = {
    "name": "dlrm-dcnv2", "num_dense": NUM_DENSE, "embedding_dim": EMBEDDING_DIM,
    "vocab_sizes": [3] * NUM_TABLES, "hotness": [1] * NUM_TABLES,
    "bottom_mlp": [32, 128], "top_mlp": [48, 1], "cross_layers": 2, "cross_rank": 8,
    "table_dtype": "fp32",
}
ST_DTYPE = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}


def to_bf16_bits(a):
    """float32 -> bfloat16 bits, round to nearest even."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_bundle(directory, dense_dtype, seed=1, st_dtype=None):
    """A bundle with CONFIG's shapes, its dense tensors rounded to
    dense_dtype (None: no dense_dtype key); returns the dense tensors'
    float32 values (the widened halves)."""
    rng = np.random.default_rng(seed)
    shapes = {}
    width = NUM_DENSE
    for i, out in enumerate(CONFIG["bottom_mlp"]):
        shapes[f"bottom_mlp.{i}.kernel"], shapes[f"bottom_mlp.{i}.bias"] = (width, out), (out,)
        width = out
    width += NUM_TABLES * EMBEDDING_DIM
    for i in range(CONFIG["cross_layers"]):
        shapes[f"cross.{i}.v"], shapes[f"cross.{i}.u"] = (width, CONFIG["cross_rank"]), (CONFIG["cross_rank"], width)
        shapes[f"cross.{i}.bias"] = (width,)
    for i, out in enumerate(CONFIG["top_mlp"]):
        shapes[f"top_mlp.{i}.kernel"], shapes[f"top_mlp.{i}.bias"] = (width, out), (out,)
        width = out
    d = dense_dtype or "fp32"
    header, blobs, values, off = {}, [], {}, 0
    for t in range(NUM_TABLES):
        a = (rng.standard_normal((3, EMBEDDING_DIM)) * 0.05).astype("<f4")
        header[f"embedding.{t}.weight"] = {"dtype": "F32", "shape": [3, EMBEDDING_DIM], "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    for name, shape in shapes.items():
        a = (rng.standard_normal(shape) / np.sqrt(shape[0] if len(shape) == 2 else 100)).astype(np.float32)
        if d == "fp16":
            stored = a.astype("<f2")
            values[name] = stored.astype(np.float32)
        elif d == "bf16":
            stored = to_bf16_bits(a)
            values[name] = (stored.astype(np.uint32) << 16).view(np.float32)
        else:
            stored, values[name] = a, a
        raw = stored.tobytes()
        header[name] = {"dtype": st_dtype or ST_DTYPE[d], "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    config = dict(CONFIG)
    if dense_dtype is not None:
        config["dense_dtype"] = dense_dtype
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
    return values


class ReadBundleTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_dense_dtypes(self):
        for dtype, np_dtype in (("fp32", np.float32), ("fp16", np.float16), ("bf16", None), (None, np.float32),
                                ("", np.float32)):
            with self.subTest(dense_dtype=dtype):
                directory = os.path.join(self.tmp.name, f"b-{dtype}")
                values = write_bundle(directory, dtype)
                config, tensors = dlrm.read_bundle(directory, want=lambda n: not dlrm.is_table(n))
                self.assertEqual(dlrm.dense_dtype(config), dtype or "fp32")
                for name, want in values.items():
                    got = tensors[name]
                    if np_dtype is None:
                        self.assertEqual(got.dtype.name, "bfloat16")
                    else:
                        self.assertEqual(got.dtype, np.dtype(np_dtype))
                    # The stored value is the exact widening.
                    np.testing.assert_array_equal(np.asarray(got, np.float32), want)

    def test_refuses_mismatches(self):
        directory = os.path.join(self.tmp.name, "mismatch")
        write_bundle(directory, "fp16", st_dtype="F32")
        with self.assertRaisesRegex(ValueError, "want F16 .*dense_dtype fp16"):
            dlrm.read_bundle(directory)
        with open(os.path.join(directory, "config.json")) as f:
            config = json.load(f)
        config["dense_dtype"] = "fp8"
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(config, f)
        with self.assertRaisesRegex(ValueError, "dense_dtype 'fp8'"):
            dlrm.read_bundle(directory)


class PlansTest(unittest.TestCase):
    """Every plan's scores against the float32 program on the widened
    weights, at buckets that take every formulation; small chunks so that
    the chunk loops run several times."""

    @classmethod
    def setUpClass(cls):
        import jax
        import jax.numpy as jnp

        cls.jax, cls.jnp = jax, jnp
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, dtype):
        jax, jnp = self.jax, self.jnp
        directory = os.path.join(self.tmp.name, dtype)
        write_bundle(directory, dtype, seed=7)
        config, tensors = dlrm.read_bundle(directory, want=lambda n: not dlrm.is_table(n))
        wide = jax.device_put(dlrm.device_dense_params(config, tensors, "fp32", None))
        ref = jax.jit(dlrm.make_forward(jax, jnp, None))
        plans = [(c, dlrm.dense_plan(config, c, "cpu", t, backend))
                 for c, t, backend in (("auto", 1, "jaxlib"), ("auto", 4, "jaxlib"), ("half", 1, "jaxlib"),
                                       ("half", 1, "plugin"))]
        plans += [("half", ((None, how),)) for how in dlrm.FORMULATIONS]
        plans.append(("half", dlrm.dense_plan(config, "half", "cuda")))  # the plain program, half arrays
        self.assertIsNone(plans[-1][1])
        self.assertIsNone(dlrm.dense_plan(config, "fp32", "cpu"))
        rng = np.random.default_rng(3)
        for compute, plan in plans:
            params = dlrm.device_dense_params(config, tensors, compute, plan)
            dlrm.describe_plan(config, plan, params)
            if plan is not None:
                held = params["top"][0][0]
                want = {"f32": np.float32, "kn": np.float16, "nk": np.float16}
                if dtype == "bf16":
                    # bf16 rides as its bits on a CPU, widened by a shift.
                    want.update(kn=np.uint16, nk=np.uint16)
                self.assertTrue(held)
                for k, v in held.items():
                    self.assertEqual(v.dtype, np.dtype(want[k]), k)
            params = jax.device_put(params)
            forward = jax.jit(dlrm.make_forward(jax, jnp, plan, chunk_bytes=4096))
            for b in (1, 3, 16, 40, 300):
                dense = rng.random((b, NUM_DENSE), dtype=np.float32)
                pooled = (rng.random((b, NUM_TABLES, EMBEDDING_DIM), dtype=np.float32) - 0.5) * 0.1
                want = np.asarray(ref(wide, dense, pooled))
                got = np.asarray(forward(params, dense, pooled))
                with self.subTest(dtype=dtype, compute=compute, plan=plan, bucket=b):
                    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)

    def test_fp16(self):
        self.check("fp16")

    def test_bf16(self):
        self.check("bf16")

    def test_fp32_program_unchanged(self):
        """A float32 bundle runs the plain program whatever the choice."""
        jax, jnp = self.jax, self.jnp
        directory = os.path.join(self.tmp.name, "fp32")
        write_bundle(directory, None)
        config, tensors = dlrm.read_bundle(directory, want=lambda n: not dlrm.is_table(n))
        for compute in dlrm.DENSE_COMPUTE:
            plan = dlrm.dense_plan(config, compute, "cpu", 1)
            self.assertIsNone(plan)
            params = dlrm.device_dense_params(config, tensors, compute, plan)
            self.assertEqual(params["top"][0][0].dtype, np.float32)
            text = jax.jit(dlrm.make_forward(jax, jnp, plan)).lower(
                params, np.zeros((2, NUM_DENSE), np.float32), np.zeros((2, NUM_TABLES, EMBEDDING_DIM), np.float32)).as_text()
            self.assertNotIn("f16", text)
            self.assertNotIn("while", text)


if __name__ == "__main__":
    unittest.main()
