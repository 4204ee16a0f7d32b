#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""gnh-convert streams a checkpoint tensor by tensor, a block of rows at a
time: its peak resident memory does not grow with the model.

The input is a Pythia-1.4B-shaped GPT-NeoX directory made here (24 layers,
hidden 2048, vocabulary 50304, untied head: 1.41e9 parameters, 2.8 GB of
bfloat16 in two safetensors shards with their index).  The converter runs
as a child process and its peak resident set size, from the kernel's
accounting of that child (``wait4``), must stay within twice the largest
tensor in float32 (the embedding, 412 MB) plus 512 MB: 1.36 GB, where the
float32 model alone is 5.66 GB.  The file's param_sha256, the converter's
hash of every value it wrote, must equal the hash of the input's widened
bfloat16, and the first and last rows of every tensor read back from the
file must equal them bit for bit.
"""
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "apps", "python"))

import hashlib  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402

import gnh_hf  # noqa: E402
from gnh_layout import HFConfig, hf_canonical_shapes  # noqa: E402

CONVERT = os.path.join(ROOT, "apps", "gnh-convert")
PYTHIA_1_4B = HFConfig(family="gpt-neox", vocab_size=50304, hidden_size=2048, intermediate_size=8192,
                       num_hidden_layers=24, num_attention_heads=16, max_position_embeddings=2048,
                       norm_eps=1e-5, rope_theta=10000.0, rotary_pct=0.25, use_parallel_residual=True,
                       hidden_act="gelu", qkv_bias=True)
#: Elements of the repeating bfloat16 pattern the tensors are cut from.
PERIOD = 1 << 20


def pattern_base() -> np.ndarray:
    """PERIOD finite bfloat16 bit patterns (weights of scale 0.02, twice over
    so that any PERIOD-long window is one slice)."""
    w = np.random.default_rng(14).normal(0.0, 0.02, PERIOD).astype("<f4")
    bits = (w.view("<u4") >> 16).astype("<u2")  # truncated to bfloat16: finite
    return np.concatenate([bits, bits])


def bits_of(base: np.ndarray, k: int, pos: int, count: int) -> np.ndarray:
    """Elements [pos, pos + count) of tensor k's flat bfloat16 bits: the
    pattern from offset 7919 k, repeated."""
    parts = []
    while count > 0:
        start = (pos + 7919 * k) % PERIOD
        m = min(count, PERIOD)
        parts.append(base[start:start + m])
        pos, count = pos + m, count - m
    return np.concatenate(parts) if len(parts) != 1 else parts[0]


def write_shard(path: str, names, shapes, index, base) -> None:
    """A safetensors file of BF16 tensors, written a PERIOD at a time."""
    header, off = {}, 0
    for name in names:
        nbytes = 2 * math.prod(shapes[name])
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(len(h).to_bytes(8, "little") + h)
        for name in names:
            n = math.prod(shapes[name])
            for pos in range(0, n, PERIOD):
                fh.write(bits_of(base, index[name], pos, min(PERIOD, n - pos)).tobytes())


class StreamedConversionTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gnh-convert-scale-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def convert_within_bound(self, src, out, shapes):
        """Convert ``src`` in a child process; its peak RSS (wait4) within
        twice the largest tensor in float32 plus 512 MB.  The kernel carries
        the resident set this process had when it forked into the child's
        peak, so the figure over-states the converter's own by this
        process's size (numpy and h5py loaded, tens of MB)."""
        with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
            t0 = time.monotonic()
            child = subprocess.Popen([sys.executable, CONVERT, src, out], stdout=so, stderr=se)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own peak
            child.returncode = os.waitstatus_to_exitcode(status)  # reaped here
            seconds = time.monotonic() - t0
            so.seek(0)
            se.seek(0)
            stdout, stderr = so.read(), se.read()
        self.assertEqual(child.returncode, 0, stderr)
        self.assertEqual(stderr, "")
        n_params = sum(math.prod(s) for s in shapes.values())
        self.assertIn(f"({n_params} parameters", stdout)
        peak = usage.ru_maxrss * 1024  # Linux reports kibibytes
        bound = 2 * 4 * max(math.prod(s) for s in shapes.values()) + (512 << 20)
        print(f"\ngnh-convert {os.path.basename(src)}: {seconds:.1f} s, peak RSS {peak / 2**20:.0f} MiB for "
              f"{n_params} parameters ({4 * n_params / 2**30:.2f} GiB of float32); bound {bound / 2**20:.0f} MiB",
              file=sys.stderr)
        self.assertLessEqual(peak, bound)

    def test_pythia_1_4b_shape_converts_within_its_memory_bound(self):
        cfg, base = PYTHIA_1_4B, pattern_base()
        shapes = hf_canonical_shapes(cfg)
        names = list(shapes)
        index = {n: k for k, n in enumerate(names)}
        src = os.path.join(self.tmp, "pythia-1.4b-shaped")
        os.makedirs(src)
        with open(os.path.join(src, "config.json"), "w") as fh:
            json.dump(gnh_hf.config_json(cfg), fh)
        weight_map = {}
        for s in range(2):
            fname = f"model-{s + 1:05d}-of-00002.safetensors"
            write_shard(os.path.join(src, fname), names[s::2], shapes, index, base)
            weight_map.update({n: fname for n in names[s::2]})
        with open(os.path.join(src, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {}, "weight_map": weight_map}, fh)

        out = os.path.join(self.tmp, "pythia.h5")
        self.convert_within_bound(src, out, shapes)

        # The hash gnh groups states by, of every value the converter wrote,
        # against the input's widened bfloat16; the first and last rows of
        # every tensor read back from the file.
        digest = hashlib.sha256()
        for name in names:
            n = math.prod(shapes[name])
            for pos in range(0, n, PERIOD):
                digest.update((bits_of(base, index[name], pos, min(PERIOD, n - pos)).astype("<u4") << 16))
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["param_sha256"], digest.hexdigest())
            self.assert_ends(f, shapes, base)

    def assert_ends(self, f, shapes, base):
        """The first and last 64 rows of every tensor, bit for bit."""
        self.assertEqual(list(f["params"]), list(shapes))
        for k, name in enumerate(shapes):
            d, rows, row = f["params"][name], shapes[name][0], math.prod(shapes[name][1:])
            self.assertEqual((d.shape, d.dtype.str), (shapes[name], "<f4"))
            for lo in sorted({0, max(0, rows - 64)}):
                got = np.ascontiguousarray(d[lo:lo + 64]).reshape(-1)
                want = (bits_of(base, k, lo * row, got.size).astype("<u4") << 16).view("<f4")
                self.assertTrue(np.array_equal(got.view("<u4"), want.view("<u4")), f"{name} rows {lo}..")

    def test_pytorch_model_bin_streams_too(self):
        """torch.save's zip archive (pytorch_model.bin): one block of the
        Pythia-1.4B shape, 1.03 GB of float32, within the same bound (1.36 GB).
        It is written by another process, so that this one stays small."""
        cfg = dataclasses.replace(PYTHIA_1_4B, num_hidden_layers=1)
        src = os.path.join(self.tmp, "pythia-1.4b-one-block")
        subprocess.run([sys.executable, __file__, "--write-bin", src], check=True, timeout=300)
        shapes = hf_canonical_shapes(cfg)
        out = os.path.join(self.tmp, "one-block.h5")
        self.convert_within_bound(src, out, shapes)
        with h5py.File(out, "r") as f:
            self.assert_ends(f, shapes, pattern_base())


def write_bin(src: str) -> None:
    """The one-block Pythia-1.4B-shaped directory as torch.save writes it."""
    import torch

    cfg, base = dataclasses.replace(PYTHIA_1_4B, num_hidden_layers=1), pattern_base()
    shapes = hf_canonical_shapes(cfg)
    os.makedirs(src)
    with open(os.path.join(src, "config.json"), "w") as fh:
        json.dump(gnh_hf.config_json(cfg), fh)
    state = {name: torch.from_numpy(bits_of(base, k, 0, math.prod(s)).view(np.int16).copy())
             .view(torch.bfloat16).reshape(s) for k, (name, s) in enumerate(shapes.items())}
    torch.save(state, os.path.join(src, "pytorch_model.bin"))

if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-bin"]:
        write_bin(sys.argv[2])
    else:
        unittest.main()
