"""Shapes every process agrees on: the model's input layout, fixed by the
protocol's tensors (dense FP32 [B, 13], sparse ids [B, sum(hotness)] over 26
tables of dimension 128), and the power-of-two batch buckets. Standard
library only: the multi-process parent sizes shared memory by it without
loading NumPy."""

NUM_TABLES = 26
NUM_DENSE = 13
EMBEDDING_DIM = 128


def next_pow2(n):
    """The bucket n examples are padded up to: 1, 2, 4, ..."""
    return 1 << (n - 1).bit_length()
