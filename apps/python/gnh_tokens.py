# SPDX-License-Identifier: BSD-3-Clause
"""Token files in the formats gnh reads (doc/model.md, "Token data"), written
for tests and for users who convert their own corpora:

- write_megatron(prefix, sequences, dtype): a Megatron indexed dataset,
  PREFIX.idx and PREFIX.bin, one document per sequence, as Megatron-LM's and
  GPT-NeoX's MMapIndexedDataset builder writes it;
- NumPy's own ``numpy.save`` writes ``.npy`` files (1-D integer arrays).
"""
import struct
from typing import Sequence

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron's dtype codes (6 and 7 are floating-point and never token ids).
CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
         np.dtype(np.int64): 5, np.dtype(np.float32): 6, np.dtype(np.float64): 7, np.dtype(np.uint16): 8}


def megatron_index(sizes: Sequence[int], dtype, code: int = 0) -> bytes:
    """The .idx bytes for sequences of these sizes (code: the dtype code to
    write, by default dtype's)."""
    dtype = np.dtype(dtype)
    sizes = np.asarray(sizes, dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes.astype(np.int64) * dtype.itemsize)[:-1]]).astype(np.int64)
    doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
    return (MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", code or CODES[dtype]) +
            struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx)) + sizes.astype("<i4").tobytes() +
            pointers[:len(sizes)].astype("<i8").tobytes() + doc_idx.astype("<i8").tobytes())


def write_megatron(prefix: str, sequences: Sequence[np.ndarray], dtype=np.uint16) -> None:
    """PREFIX.bin (the sequences' tokens in order, little-endian) and PREFIX.idx."""
    dtype = np.dtype(dtype).newbyteorder("<")
    with open(prefix + ".bin", "wb") as f:
        for s in sequences:
            f.write(np.asarray(s).astype(dtype).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(megatron_index([len(s) for s in sequences], dtype))
