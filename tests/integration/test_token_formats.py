#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Token data as it is published (doc/model.md, "Token data"):
- the same tokens as a flat uint16 file, NumPy .npy files (uint16 and int64)
  and Megatron indexed datasets (uint16 and int32, documents of uneven
  length, named by .bin, .idx or the prefix) give bitwise the same loss and
  |G|^2;
- layout = "sequences" (each sample its own block, no overlap) gives the
  stream's values where its samples hold the stream's blocks;
- every malformed file stops the run before anything is computed with one
  line naming the file and the field or offset; a dtype beside a format
  whose files carry their own is a deck error with its line."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import gnhtest
import h5py
import numpy as np

sys.path.insert(0, os.path.join(gnhtest.ROOT, "apps", "python"))
import gnh_tokens  # noqa: E402

ANALYSIS = dict(noise_samples=0, directions=0)


class TokenFormats(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-tokens-")
        cls.ck = gnhtest.small_campaign(cls.tmp)
        cls.tokens = np.fromfile(os.path.join(cls.tmp, "train.bin"), dtype="<u2")
        # Documents of uneven length, as a tokenizer's output is.
        cuts = [0, 7, 30, 31, 90, len(cls.tokens)]
        cls.docs = [cls.tokens[a:b] for a, b in zip(cuts, cuts[1:])]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def deck(self, name, seen):
        path = os.path.join(self.tmp, name + ".toml")
        gnhtest.write_deck(path, f"out/{name}.h5", [os.path.join(self.ck, "*.h5")], 8, "train.bin",
                           analysis=ANALYSIS)
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace('seen = { path = "train.bin", dtype = "uint16" }', f"seen = {seen}"))
        return path

    def seen_values(self, name, seen):
        r = gnhtest.run_gnh(self.deck(name, seen), 1)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        with h5py.File(os.path.join(self.tmp, "out", name + ".h5"), "r") as f:
            return [(g["seen"].attrs["loss"], g["seen"].attrs["G_sqnorm"], g["seen"].attrs["tokens"])
                    for _, g in sorted(f["groups"].items())]

    def test_every_format_gives_the_flat_files_values(self):
        want = self.seen_values("flat", '{ path = "train.bin", dtype = "uint16" }')
        np.save(os.path.join(self.tmp, "u2.npy"), self.tokens.astype("<u2"))
        np.save(os.path.join(self.tmp, "i8.npy"), self.tokens.astype("<i8"))
        gnh_tokens.write_megatron(os.path.join(self.tmp, "mu2"), self.docs, np.uint16)
        gnh_tokens.write_megatron(os.path.join(self.tmp, "mi4"), self.docs, np.int32)
        for name, seen in (("npy_u2", '{ path = "u2.npy", format = "npy" }'),
                           ("npy_i8", '{ path = "i8.npy", format = "npy" }'),
                           ("meg_bin", '{ path = "mu2.bin", format = "megatron" }'),
                           ("meg_idx", '{ path = "mi4.idx", format = "megatron" }'),
                           ("meg_prefix", '{ path = "mu2", format = "megatron" }')):
            with self.subTest(name=name):
                self.assertEqual(self.seen_values(name, seen), want)

    def test_samples_layout_gives_the_streams_blocks(self):
        # layout = "sequences": sample i is tokens [i S, (i + 1) S) and its
        # block the first T + 1 of them. Samples cut from the stream's blocks
        # (each the 9 tokens of a block of context 8, then 3 tokens that no
        # block reads where S = 12) give the stream's loss and |G|^2 bit for
        # bit, as a flat file and as a Megatron dataset of one document per
        # sample (Pythia's and Megatron's layout).
        want = self.seen_values("flat_s", '{ path = "train.bin", dtype = "uint16" }')
        blocks = [self.tokens[8 * i:8 * i + 9] for i in range((len(self.tokens) - 1) // 8)]
        np.concatenate(blocks).astype("<u2").tofile(os.path.join(self.tmp, "s9.bin"))
        padded = [np.concatenate([b, np.full(3, 18, dtype=b.dtype)]) for b in blocks]
        gnh_tokens.write_megatron(os.path.join(self.tmp, "s12"), padded, np.uint16)
        for name, seen in (("seq9", '{ path = "s9.bin", layout = "sequences", sequence_length = 9 }'),
                           ("seq12", '{ path = "s12", format = "megatron", layout = "sequences", '
                                     'sequence_length = 12 }')):
            with self.subTest(name=name):
                self.assertEqual(self.seen_values(name, seen), want)
        self.refused("seq_short", '{ path = "s9.bin", layout = "sequences", sequence_length = 8 }',
                     "data.seen.sequence_length = 8 is shorter than a block", "context 8 needs 9 tokens")
        self.refused("seq_none", '{ path = "s9.bin", layout = "sequences" }', "no sequence_length")
        self.refused("seq_stream", '{ path = "s9.bin", sequence_length = 9 }', 'needs layout = "sequences"')

    def refused(self, name, seen, *expect):
        # One process without mpirun (MPI's singleton): a fifth of the start-up.
        r = subprocess.run([gnhtest.GNH, "run", self.deck(name, seen), "--quiet"], capture_output=True, text=True,
                           timeout=120, env=gnhtest.mpi_env())
        self.assertNotEqual(r.returncode, 0, r.stdout)
        errors = [l for l in r.stderr.splitlines() if l.startswith("gnh: error:")]
        self.assertEqual(len(errors), 1, r.stderr)
        for e in expect:
            self.assertIn(e, errors[0])
        self.assertNotIn("loss", r.stdout)  # nothing was computed
        self.assertNotIn("Traceback", r.stderr)

    def megatron(self, name, idx=None, bin_=None, dtype=np.uint16, docs=None):
        prefix = os.path.join(self.tmp, name)
        gnh_tokens.write_megatron(prefix, docs if docs is not None else self.docs, dtype)
        for path, edit in ((prefix + ".idx", idx), (prefix + ".bin", bin_)):
            if edit:
                with open(path, "rb") as f:
                    data = bytearray(f.read())
                with open(path, "wb") as f:
                    f.write(edit(data))
        return f'{{ path = "{name}.bin", format = "megatron" }}'

    def test_malformed_megatron_files(self):
        n = len(self.docs)

        def put(at, fmt, value):
            def edit(data):
                struct.pack_into(fmt, data, at, value)
                return data
            return edit

        self.refused("m_magic", self.megatron("m_magic", idx=put(0, "<B", ord("X"))), "m_magic.idx", "MMIDIDX")
        self.refused("m_version", self.megatron("m_version", idx=put(9, "<Q", 2)), "m_version.idx", "version 2")
        self.refused("m_float", self.megatron("m_float", idx=put(17, "<B", 7)), "dtype code 7", "floating-point")
        self.refused("m_code", self.megatron("m_code", idx=put(17, "<B", 9)), "unknown dtype code 9")
        self.refused("m_count", self.megatron("m_count", idx=put(18, "<Q", n + 1)), "sequences (byte 18)")
        self.refused("m_pointer", self.megatron("m_pointer", idx=put(34 + 4 * n + 8 * 2, "<q", 3)),
                     "sequence 2's pointer 3", f"byte {34 + 4 * n + 16}")
        self.refused("m_short", self.megatron("m_short", bin_=lambda d: d[:-2]), "m_short.bin", "truncated")
        self.refused("m_docs", self.megatron("m_docs", idx=put(34 + 12 * n + 8, "<q", n + 5)), "document index 1")
        big = [np.array([0, 3, 19, 2], dtype=np.uint16)] + self.docs
        self.refused("m_vocab", self.megatron("m_vocab", docs=big), "m_vocab.bin", "token id 19 at offset 2 (byte 4)")

    def test_malformed_npy_files(self):
        def npy(name, array=None, header=None):
            path = os.path.join(self.tmp, name + ".npy")
            np.save(path, self.tokens if array is None else array)
            if header:
                with open(path, "rb") as f:
                    data = f.read()
                hl = struct.unpack("<H", data[8:10])[0]
                h = header(data[10:10 + hl].decode("latin1")).encode("latin1")
                h = h.ljust(hl)[:hl]
                with open(path, "wb") as f:
                    f.write(data[:10] + h + data[10 + hl:])
            return f'{{ path = "{name}.npy", format = "npy" }}'

        self.refused("n_2d", npy("n_2d", self.tokens[:160].reshape(20, 8)), "n_2d.npy", "one-dimensional")
        self.refused("n_big", npy("n_big", self.tokens.astype(">u2")), "'>u2'", "little-endian integer")
        self.refused("n_float", npy("n_float", self.tokens.astype("<f4")), "'<f4'")
        self.refused("n_fortran", npy("n_fortran", header=lambda h: h.replace("False", "True ")), "C order")
        self.refused("n_vocab", npy("n_vocab", np.array([1, 2, 40] * 60, dtype="<u2")), "token id 40 at offset 2")
        path = os.path.join(self.tmp, "n_short.npy")
        np.save(path, self.tokens)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 4)
        self.refused("n_short", '{ path = "n_short.npy", format = "npy" }', "n_short.npy", "needs",
                     "bytes after the header")
        self.refused("n_magic", '{ path = "train.bin", format = "npy" }', "train.bin", "not a NumPy .npy file")
        # The file says what its ids are: a dtype beside it is a deck error, with its line.
        self.refused("n_dtype", '{ path = "train.bin", format = "npy", dtype = "uint16" }', "n_dtype.toml:",
                     "data.seen.dtype does not go with format \"npy\"")


if __name__ == "__main__":
    unittest.main()
