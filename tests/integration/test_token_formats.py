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
  whose files carry their own is a deck error with its line;
- a seen case tied to each checkpoint's step (steps_before, batch_samples;
  the step from iter_num or the deck's [checkpoints] steps) analyses the
  samples of the steps before it, records their range and tokens' digest,
  gives a fixed `samples` range's values bit for bit at 1, 2 and 3 ranks,
  keeps one analysis per (parameters, step), and recomputes on resume only
  the state whose tokens changed."""
import hashlib
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
import gnh_model  # noqa: E402
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

    def test_seen_samples_tied_to_each_checkpoints_step(self):
        # Samples of S = 9 tokens (context 8), B = 2 a training step, the W = 3
        # steps before each state: step s reads samples [2 (s - 3), 2 s).
        rng = np.random.default_rng(7)
        samples = rng.integers(0, 19, size=(20, 9)).astype(np.uint16)
        d = os.path.join(self.tmp, "steps")
        os.makedirs(d)
        gnh_tokens.write_megatron(os.path.join(d, "pile"), list(samples), np.uint16)
        samples.tofile(os.path.join(d, "flat.bin"))
        cfg = gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=19, bias=True,
                                  tie_embeddings=True)
        # a (step 5) and b (step 9) record iter_num; c and d hold a's parameters
        # without one, at steps 7 and 5 from the deck: c is a state of its own
        # (other samples), d an alias of a.
        gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=0), d, "a", iter_num=5)
        gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=1), d, "b", iter_num=9)
        for stem in ("c", "d"):
            gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=0), d, stem)
        steps = '\nsteps = { "c.h5" = 7, "d*" = 5 }'

        def write(name, seen, table=steps, unseen='{ path = "flat.bin", layout = "sequences", sequence_length = 9, '
                                                  'samples = [4, 10] }'):
            path = os.path.join(d, name + ".toml")
            with open(path, "w") as f:
                f.write(f'[run]\noutput = "out/{name}.h5"\n[checkpoints]\npaths = ["*.h5"]{table}\n'
                        f'[data]\ncontext = 8\nseen = {seen}\nunseen = {unseen}\n[analysis]\n'
                        'grad_microbatch = 4\nhvp_batch = 3\nnoise_samples = 2\nnoise_batch = 3\ndirections = 2\n'
                        'directions_per_pass = 5\nseed = 1234\n')
            return path

        seen = ('{ path = "pile", format = "megatron", layout = "sequences", sequence_length = 9, '
                'steps_before = 3, batch_samples = 2 }')
        deck = write("tied", seen)
        keys = ["loss", "G_sqnorm", "GHG", "trace_sigma", "trace_H", "sample_first", "sample_end"]

        def values(out):
            with h5py.File(os.path.join(d, "out", out + ".h5"), "r") as f:
                return {tuple(sorted(gnhtest.text(a) for a in g.attrs["aliases"])):
                        {c: ([float(g[c].attrs[k]) for k in keys], gnhtest.text(g[c].attrs["tokens_sha256"]))
                         for c in g} for _, g in f["groups"].items()}

        runs = {}
        for np_, rpc in ((1, 1), (2, 2), (3, 1)):
            r = gnhtest.run_gnh(deck, np_, sets=[f"run.output=out/tied{np_}.h5",
                                                 f"parallel.ranks_per_checkpoint={rpc}"])
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            runs[np_] = values(f"tied{np_}")
        self.assertEqual(runs[2], runs[1])
        self.assertEqual(runs[3], runs[1])
        v = runs[1]
        self.assertEqual(sorted(v), [("a.h5", "d.h5"), ("b.h5",), ("c.h5",)])
        for aliases, (first, end) in ((("a.h5", "d.h5"), (4, 10)), (("b.h5",), (12, 18)), (("c.h5",), (8, 14))):
            got, digest = v[aliases]["seen"]
            self.assertEqual(got[-2:], [first, end])
            # The tokens from the first sample's first to the last block's last
            # target (every sample's 9 here), as little-endian int32.
            want = samples[first:end].reshape(-1).astype("<i4").tobytes()
            self.assertEqual(digest, hashlib.sha256(want).hexdigest())
        # Step 5's samples [4, 10) are the unseen case's fixed range: the same bits.
        self.assertEqual(v[("a.h5", "d.h5")]["seen"], v[("a.h5", "d.h5")]["unseen"])
        self.assertNotEqual(v[("c.h5",)]["seen"][0][0], v[("a.h5", "d.h5")]["seen"][0][0])

        # A resumed run recomputes the state whose samples' tokens changed, and only it.
        with open(os.path.join(d, "pile.bin"), "r+b") as f:
            f.seek(2 * (9 * 16 + 3))  # a token of sample 16: b's window alone
            f.write(np.uint16((samples[16, 3] + 1) % 19).tobytes())
        r = gnhtest.run_gnh(deck, 1, sets=["run.output=out/tied1.h5"], quiet=False)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        self.assertIn("computed 1, reused 2", r.stdout)

        # Refused before anything is computed, with one line.
        self.refused_deck(write("no_step", seen, table=""), "steps_before needs each checkpoint's training step",
                          "c.h5 records no iter_num")
        self.refused_deck(write("disagree", seen, table='\nsteps = { "c.h5" = 7, "d*" = 5, "a*" = 6 }'),
                          '"a*" = 6 but', "a.h5 records iter_num 5")
        self.refused_deck(write("beyond", seen.replace("steps_before = 3, batch_samples = 2",
                                                       "steps_before = 3, batch_samples = 3")),
                          "pile", "selects samples [18, 27) for b.h5 (step 9), the source holds 20")
        self.refused_deck(write("both", seen.replace("steps_before = 3", "steps_before = 3, samples = [0, 4]")),
                          "data.seen.steps_before and data.seen.samples both choose the samples")
        self.refused_deck(write("after", seen, unseen='{ path = "flat.bin", layout = "sequences", '
                                                      'sequence_length = 9, samples = [15, 21] }'),
                          "flat.bin", "data.unseen selects samples [15, 21), the source holds 20")

    def refused(self, name, seen, *expect):
        self.refused_deck(self.deck(name, seen), *expect)

    def refused_deck(self, deck, *expect):
        # One process without mpirun (MPI's singleton): a fifth of the start-up.
        r = subprocess.run([gnhtest.GNH, "run", deck, "--quiet"], capture_output=True, text=True,
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
