#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""gnh-convert on Hugging Face checkpoint directories of the Llama and
GPT-NeoX families (SPEC section 11): model.safetensors and pytorch_model.bin,
each single and sharded with its index JSON; float32, float16 and bfloat16;
tied and untied; Qwen2's and Mistral's configs (Mistral's without a sliding
window converts as llama). Values bit for bit (bf16 and
f16 widened exactly), /config as SPEC section 11 names it, canonical order,
buffers ignored. Every refusal (rope_scaling, sliding windows, mlp_bias, an
unknown architecture, unknown, missing or misshapen tensors, a tied head that
differs from the embedding) exits 1 with one line naming the key or tensor and
leaves no output file.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "apps", "python"))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import gnh_families  # noqa: E402
import gnh_hf  # noqa: E402
from gnh_layout import HFConfig, hf_canonical_shapes  # noqa: E402

CONVERT = os.path.join(ROOT, "apps", "gnh-convert")


def llama(**kw):
    base = dict(family="llama", vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, norm_eps=1e-6,
                rope_theta=500000.0, hidden_act="silu")
    base.update(kw)
    return HFConfig(**base)


def neox(**kw):
    base = dict(family="gpt-neox", vocab_size=37, hidden_size=16, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=32, norm_eps=1e-5, rope_theta=10000.0,
                rotary_pct=0.25, use_parallel_residual=True, hidden_act="gelu", qkv_bias=True)
    base.update(kw)
    return HFConfig(**base)


def state_of(cfg, seed):
    model = gnh_families.init_random(gnh_families.CausalLM(cfg), seed, 0.5)
    return {n: p.numpy().astype(np.float32) for n, p in gnh_families.canonical_state(model).items()}


def bf16_round(a):
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype("<u4").view("<f4")


class HFConvertTests(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gnh-hf-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_convert(self, src, out):
        return subprocess.run([sys.executable, CONVERT, src, out], capture_output=True, text=True, timeout=120)

    def convert_ok(self, src):
        out = os.path.join(self.tmp, os.path.basename(src) + ".h5")
        r = self.run_convert(src, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        return out

    def check_file(self, h5, cfg, state):
        with h5py.File(h5, "r") as f:
            c = f["config"].attrs
            self.assertEqual(c["family"], cfg.family)
            self.assertEqual(int(c["num_hidden_layers"]), cfg.num_hidden_layers)
            self.assertEqual(int(c["tie_word_embeddings"]), int(cfg.tie_word_embeddings))
            if cfg.family == "llama":
                self.assertEqual(int(c["num_key_value_heads"]), cfg.num_key_value_heads)
                self.assertEqual(float(c["rope_theta"]), cfg.rope_theta)
            else:
                self.assertEqual(float(c["rotary_pct"]), cfg.rotary_pct)
                self.assertEqual(int(c["use_parallel_residual"]), int(cfg.use_parallel_residual))
            self.assertEqual(list(f["params"].keys()), list(hf_canonical_shapes(cfg)))
            for name, want in state.items():
                got = f["params"][name][()]
                self.assertEqual(got.dtype, np.float32, name)
                self.assertTrue(np.array_equal(got, want), name)

    def test_safetensors_every_family_dtype_and_sharding(self):
        cases = [("llama-gqa-tied", llama(tie_word_embeddings=True)),
                 ("llama-untied-headdim", llama(head_dim=6)),
                 ("qwen2", llama(qkv_bias=True, num_key_value_heads=1)),
                 ("llama-bias", llama(qkv_bias=True, o_bias=True)),
                 ("pythia", neox()),
                 ("neox-sequential-tied", neox(use_parallel_residual=False, tie_word_embeddings=True,
                                               qkv_bias=False, hidden_act="gelu_new"))]
        for i, (name, cfg) in enumerate(cases):
            state = state_of(cfg, i)
            for dtype, shards in (("F32", 1), ("BF16", 1), ("F16", 3), ("F32", 2)):
                with self.subTest(case=name, dtype=dtype, shards=shards):
                    d = os.path.join(self.tmp, f"{name}-{dtype}-{shards}")
                    gnh_hf.save_dir(d, cfg, state, dtype=dtype, shards=shards)
                    h5 = self.convert_ok(d)
                    want = {"F32": lambda a: a, "BF16": bf16_round,
                            "F16": lambda a: a.astype(np.float16).astype(np.float32)}[dtype]
                    self.check_file(h5, cfg, {n: want(a) for n, a in state.items()})

    def save_bin(self, d, cfg, state, shards=1, extra=None, dtype=torch.float32):
        """pytorch_model.bin as transformers' save_pretrained(safe_serialization=False) writes it."""
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(gnh_hf.config_json(cfg), fh)
        tensors = {n: torch.from_numpy(a).to(dtype) for n, a in state.items()}
        tensors.update(extra or {})
        if shards == 1:
            torch.save(tensors, os.path.join(d, "pytorch_model.bin"))
            return
        names, wm = list(tensors), {}
        for s in range(shards):
            fname = f"pytorch_model-{s + 1:05d}-of-{shards:05d}.bin"
            torch.save({n: tensors[n] for n in names[s::shards]}, os.path.join(d, fname))
            wm.update({n: fname for n in names[s::shards]})
        with open(os.path.join(d, "pytorch_model.bin.index.json"), "w") as fh:
            json.dump({"metadata": {}, "weight_map": wm}, fh)

    def test_config_records_every_hyperparameter(self):
        # Values away from the defaults, so that a hyperparameter dropped or
        # taken from the wrong key of config.json shows. The expected /config
        # is read from the directory's config.json, not from the HFConfig.
        cases = [("llama", llama(head_dim=6, norm_eps=3e-5, rope_theta=12345.0, max_position_embeddings=48,
                                 qkv_bias=True, o_bias=True, vocab_size=41)),
                 ("qwen2", llama(qkv_bias=True, num_key_value_heads=1, intermediate_size=40, norm_eps=2e-6)),
                 ("neox", neox(use_parallel_residual=False, hidden_act="gelu_new", rotary_pct=0.5,
                               rope_theta=777.0, norm_eps=4e-5, qkv_bias=False, tie_word_embeddings=True))]
        common = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "max_position_embeddings", "tie_word_embeddings")
        for i, (name, cfg) in enumerate(cases):
            with self.subTest(case=name):
                d = os.path.join(self.tmp, name)
                gnh_hf.save_dir(d, cfg, state_of(cfg, 10 + i))
                with open(os.path.join(d, "config.json")) as fh:
                    cj = json.load(fh)
                want = {k: cj[k] for k in common}
                if cfg.family == "llama":
                    qwen2 = cj["architectures"] == ["Qwen2ForCausalLM"]
                    want.update(num_key_value_heads=cj["num_key_value_heads"], head_dim=cj["head_dim"],
                                rms_norm_eps=cj["rms_norm_eps"], rope_theta=cj["rope_theta"],
                                qkv_bias=True if qwen2 else cj["attention_bias"],
                                o_bias=False if qwen2 else cj["attention_bias"])
                else:
                    want.update(rotary_pct=cj["rotary_pct"], rotary_emb_base=cj["rotary_emb_base"],
                                layer_norm_eps=cj["layer_norm_eps"],
                                use_parallel_residual=cj["use_parallel_residual"], hidden_act=cj["hidden_act"],
                                attention_bias=cj["attention_bias"])
                with h5py.File(self.convert_ok(d), "r") as f:
                    got = dict(f["config"].attrs)
                self.assertEqual(got.pop("family"), cfg.family)
                self.assertEqual(sorted(got), sorted(want))
                for key, value in want.items():
                    g = got[key]
                    g = g.decode() if isinstance(g, bytes) else g
                    if isinstance(value, bool):
                        self.assertEqual(int(g), int(value), key)
                    elif isinstance(value, str):
                        self.assertEqual(g, value, key)
                    else:
                        self.assertEqual(float(g), float(value), key)

    def test_mistral_config_without_a_sliding_window_is_llama(self):
        cfg = llama(num_key_value_heads=1)
        state = state_of(cfg, 21)
        d = os.path.join(self.tmp, "mistral")
        gnh_hf.save_dir(d, cfg, state)
        with open(os.path.join(d, "config.json")) as fh:
            c = json.load(fh)
        # MistralConfig as transformers writes it: no attention_bias, mlp_bias
        # or head_dim keys, sliding_window null.
        for key in ("attention_bias", "mlp_bias", "head_dim"):
            c.pop(key, None)
        c.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(c, fh)
        h5 = self.convert_ok(d)
        self.check_file(h5, cfg, state)
        with h5py.File(h5, "r") as f:
            self.assertEqual(int(f["config"].attrs["qkv_bias"]), 0)
            self.assertEqual(int(f["config"].attrs["head_dim"]), cfg.hidden_size // cfg.num_attention_heads)

    def test_pytorch_bin_single_and_sharded_with_buffers_and_a_tied_head_written_out(self):
        cfg = llama(tie_word_embeddings=True)
        state = state_of(cfg, 7)
        # Old checkpoints carry rotary buffers; a tied head may be saved beside the embedding.
        extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2),
                 "lm_head.weight": torch.from_numpy(state["model.embed_tokens.weight"])}
        for shards in (1, 2):
            d = os.path.join(self.tmp, f"bin{shards}")
            self.save_bin(d, cfg, state, shards, extra)
            self.check_file(self.convert_ok(d), cfg, state)
        cfg = neox()
        state = state_of(cfg, 8)
        d = os.path.join(self.tmp, "neox-bin-bf16")
        self.save_bin(d, cfg, state, 1, {"gpt_neox.layers.1.attention.bias": torch.ones(1, 1, 4, 4)},
                      dtype=torch.bfloat16)
        self.check_file(self.convert_ok(d), cfg, {n: bf16_round(a) for n, a in state.items()})

    def test_step_directories_give_the_iteration(self):
        # The step from the directory's name (a Pythia revision), from the
        # HF Trainer's trainer_state.json, from both where they agree; none
        # without either; refused, naming the file, where they disagree or
        # the file's step is not an integer.
        cfg = neox()
        state = state_of(cfg, 1)
        cases = {"pythia-14m-step1000": (None, 1000), "trained": (1234, 1234), "checkpoint-500": (500, 500),
                 "plain": (None, None)}
        for name, (global_step, want) in cases.items():
            with self.subTest(directory=name):
                d = os.path.join(self.tmp, name)
                gnh_hf.save_dir(d, cfg, state)
                if global_step is not None:
                    with open(os.path.join(d, "trainer_state.json"), "w") as fh:
                        json.dump({"global_step": global_step, "epoch": 0.5}, fh)
                with h5py.File(self.convert_ok(d), "r") as f:
                    self.assertEqual(int(f.attrs["iter_num"]) if "iter_num" in f.attrs else None, want)
        for name, body, words in (("checkpoint-600", {"global_step": 599}, ("global_step = 599", "step 600")),
                                  ("bad-step", {"global_step": "600"}, ("trainer_state.json", "'600'"))):
            with self.subTest(directory=name):
                d = os.path.join(self.tmp, name)
                gnh_hf.save_dir(d, cfg, state)
                with open(os.path.join(d, "trainer_state.json"), "w") as fh:
                    json.dump(body, fh)
                self.refused(d, *words)

    def refused(self, d, *words):
        out = os.path.join(self.tmp, "refused.h5")
        r = self.run_convert(d, out)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        for w in words:
            self.assertIn(w, r.stderr)
        self.assertFalse(os.path.exists(out))

    def edit_config(self, d, **changes):
        p = os.path.join(d, "config.json")
        with open(p) as fh:
            c = json.load(fh)
        c.update(changes)
        with open(p, "w") as fh:
            json.dump(c, fh)

    def test_every_refusal_is_one_line_naming_what(self):
        cfg = llama()
        state = state_of(cfg, 3)

        def fresh(name, st=None, c=cfg):
            d = os.path.join(self.tmp, name)
            gnh_hf.save_dir(d, c, st if st is not None else state)
            return d

        d = fresh("rope")
        self.edit_config(d, rope_scaling={"type": "linear", "factor": 2.0})
        self.refused(d, "rope_scaling")
        d = fresh("mistral")
        self.edit_config(d, architectures=["MistralForCausalLM"], sliding_window=4096)
        self.refused(d, "sliding_window")
        d = fresh("qwen2-window", c=llama(qkv_bias=True))
        self.edit_config(d, use_sliding_window=True)
        self.refused(d, "use_sliding_window")
        d = fresh("mlp-bias")
        self.edit_config(d, mlp_bias=True)
        self.refused(d, "mlp_bias")
        d = fresh("arch")
        self.edit_config(d, architectures=["GPT2LMHeadModel"])
        self.refused(d, "GPT2LMHeadModel")
        d = fresh("act")
        self.edit_config(d, hidden_act="relu")
        self.refused(d, "hidden_act")
        st = dict(state)
        st["model.layers.0.mlp.extra.weight"] = np.ones(3, np.float32)
        self.refused(fresh("unknown", st), "unknown tensor", "model.layers.0.mlp.extra.weight")
        st = dict(state)
        del st["model.layers.1.post_attention_layernorm.weight"]
        self.refused(fresh("missing", st), "missing tensor", "model.layers.1.post_attention_layernorm.weight")
        st = dict(state)
        st["model.layers.0.self_attn.k_proj.weight"] = np.ones((16, 16), np.float32)
        self.refused(fresh("shape", st), "model.layers.0.self_attn.k_proj.weight", "(16, 16)")
        tied = llama(tie_word_embeddings=True)
        st = state_of(tied, 4)
        st["lm_head.weight"] = st["model.embed_tokens.weight"] + 1
        self.refused(fresh("tied", st, tied), "lm_head.weight", "tie_word_embeddings")
        # GPT-NeoX's tensors: the fused per-head q/k/v product misshapen, a
        # bias that attention_bias = true requires missing, and a tensor the
        # family does not have.
        nx = neox()
        nst = state_of(nx, 5)
        st = dict(nst)
        st["gpt_neox.layers.1.attention.query_key_value.weight"] = np.ones((16, 16), np.float32)
        self.refused(fresh("neox-shape", st, nx), "gpt_neox.layers.1.attention.query_key_value.weight", "(16, 16)")
        st = dict(nst)
        del st["gpt_neox.layers.0.attention.query_key_value.bias"]
        self.refused(fresh("neox-missing", st, nx), "missing tensor",
                     "gpt_neox.layers.0.attention.query_key_value.bias")
        st = dict(nst)
        st["gpt_neox.layers.0.attention.dense.extra"] = np.ones(2, np.float32)
        self.refused(fresh("neox-unknown", st, nx), "unknown tensor", "gpt_neox.layers.0.attention.dense.extra")
        d = fresh("neox-rope", c=nx)
        self.edit_config(d, rope_scaling={"type": "dynamic", "factor": 2.0})
        self.refused(d, "rope_scaling")
        d = os.path.join(self.tmp, "empty")
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(gnh_hf.config_json(cfg), fh)
        self.refused(d, "model.safetensors")
        d = fresh("index")
        os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, "x.safetensors"))
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
            json.dump({"weight_map": {"model.norm.weight": "../x.safetensors"}}, fh)
        self.refused(d, "model.norm.weight", "not a file of this directory")


class FamilyDemoTests(unittest.TestCase):
    """apps/gnh-demo-campaign --family: each epoch in Hugging Face layout, the
    step in the directory's name, converted with the model's values."""

    def test_family_demo_checkpoints(self):
        import contextlib
        import importlib.machinery
        import importlib.util
        import io
        loader = importlib.machinery.SourceFileLoader("gnh_demo_campaign", os.path.join(ROOT, "apps",
                                                                                       "gnh-demo-campaign"))
        demo = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(demo)
        demo.SETTINGS.update(epochs=2, max_steps_per_epoch=3, batch_blocks=4, eval_batch_blocks=8)
        rng = np.random.default_rng(7)
        train_tokens = rng.integers(0, 256, 40 * 64).astype("<u2")
        val_tokens = rng.integers(0, 256, 9 * 64).astype("<u2")
        for family in ("llama", "gpt-neox"):
            with self.subTest(family=family):
                tmp = tempfile.mkdtemp(prefix="gnh-demo-family-")
                self.addCleanup(shutil.rmtree, tmp, True)
                with contextlib.redirect_stdout(io.StringIO()):
                    dirs = demo.train_family(tmp, family, train_tokens, val_tokens)
                self.assertEqual([os.path.basename(d) for d in dirs], ["step3", "step6"])
                for d in dirs:
                    self.assertEqual(sorted(os.listdir(d)), ["config.json", "model.safetensors"])
                    cfg = gnh_hf.read_config(d)
                    self.assertEqual(cfg.family, family)
                    h5 = os.path.join(tmp, os.path.basename(d) + ".h5")
                    r = subprocess.run([sys.executable, CONVERT, d, h5], capture_output=True, text=True)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    state, _ = gnh_hf.read_weights(d)
                    with h5py.File(h5, "r") as f:
                        self.assertEqual(int(f.attrs["iter_num"]), int(os.path.basename(d)[4:]))
                        self.assertNotIn("optimizer", f)
                        for name in hf_canonical_shapes(cfg):
                            self.assertTrue(np.array_equal(f["params"][name][()], state[name].array), name)


if __name__ == "__main__":
    unittest.main()
