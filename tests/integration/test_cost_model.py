"""The GPU cost model (bench_engine --predict h200, perf/cost_model.hpp).

The prediction runs the GPU-shaped path on this host at a miniature of the
shape, s times smaller in every scalable extent, with the full shape's plan
imposed, and scales its work back. These tests check that the miniature
issues exactly the full pass's launches, label by label, and exactly its
GEMM FLOPs and bytes once scaled (against the pass itself, run at scale 1,
in each family, with several attention chunks and head tiles), that every
launch carries the work it moves, and the prediction at the reference shape:
its last line, and its launches within the stated budget.
"""
import json
import math
import os
import re
import subprocess
import unittest

import gnhtest

BENCH = os.environ.get("GNH_BENCH", os.path.join(gnhtest.ROOT, "build", "bin", "bench_engine"))
LAST = re.compile(r"^predicted h200: gradient ([0-9.e+-]+) s/epoch, second-order K=(\d+) bf16-amp ([0-9.e+-]+) "
                  r"s/direction, launches per pass (\d+)$")


def predict(*args, gpu="h200"):
    r = subprocess.run([BENCH, "--predict", gpu, "--no-probe", *args], capture_output=True, text=True,
                       env=gnhtest.mpi_env())
    if r.returncode != 0:
        raise AssertionError(f"bench_engine --predict {args} failed: {r.stderr}")
    body, last = r.stdout.rstrip("\n").rsplit("\n", 1)
    return json.loads(body), last


def labels(d, name):
    return {l["label"]: l for l in d[name]["prediction"]["labels"]}


class CostModel(unittest.TestCase):
    def test_a_miniature_issues_the_full_pass(self):
        # Preset small (T = 128, C = 128, V = 1024) at 16 sequences, the head
        # in 7 tiles of 300 rows and the attention in chunks of 5 sequences
        # (4 chunks) and causal query blocks of 32 rows (4): at scale 4 the
        # miniature (T = 32, C = 32, V = 256) must launch what the pass itself
        # launches, label by label, and its GEMM FLOPs and bytes times 4^3 and
        # 4^d must equal the pass's. Every count
        # is an integer below 2^53 scaled by a power of two and printed with
        # 17 digits, so they compare exactly.
        # The gradient (and with per-sequence norms) at TF32 (the batched
        # attention) and under bf16-amp (the fused attention, the head's
        # operands rounded by chunks of rows).
        for family in ("nanogpt", "llama", "gpt-neox"):
            for precision in ("tf32", "bf16-amp"):
                common = ["--synthetic", "small", "--family", family, "--batch", "16", "--directions", "4",
                          "--head-tile", "300,1024", "--attention-sequences", "5", "--attention-blocks", "4",
                          "--precision", precision]
                full, _ = predict(*common, "--predict-scale", "1")
                mini, _ = predict(*common, "--predict-scale", "4")
                self.assertEqual(full["scale"], 1)
                self.assertEqual(mini["scale"], 4)
                for name in ("gradient", "second_order", "per_sequence"):
                    where = (family, precision, name)
                    a, b = labels(full, name), labels(mini, name)
                    self.assertEqual(set(a), set(b), where)
                    for label in a:
                        for field in ("launches", "tensor", "fp32", "fp64", "bytes"):
                            self.assertEqual(a[label][field], b[label][field], (*where, label, field))
                    self.assertEqual(full[name]["prediction"]["device_launches"],
                                     mini[name]["prediction"]["device_launches"])
                    # The structure imposed is exercised: several chunks and tiles.
                    if name != "second_order" and precision == "bf16-amp":
                        self.assertGreaterEqual(a["gnh::attention::fused::reverse"]["launches"], 2, where)
                        self.assertGreaterEqual(a["gnh::lm_head_xent::reverse::softmax"]["launches"], 7, where)
                    else:
                        self.assertGreaterEqual(a["gnh::attention::batched::softmax"]["launches"], 4 * 2, where)
                    self.assertGreaterEqual(a["gnh::lm_head_xent::forward"]["launches"], 7, where)

    def test_every_launch_moves_its_bytes(self):
        # A label that launches and records no work would cost only its
        # launches: every kernel records the bytes it moves (and a GEMM its
        # FLOPs), in every family and both passes, under bf16-amp's copies too.
        for family in ("nanogpt", "llama", "gpt-neox"):
            d, _ = predict("--synthetic", "small", "--family", family, "--batch", "4", "--directions", "2",
                           "--predict-scale", "1")
            for name in ("gradient", "second_order"):
                for label, l in labels(d, name).items():
                    if l["launches"] > 0:
                        self.assertGreater(l["bytes"], 0, (family, name, label))
                    if label.startswith("gnh::gemm") and "::" not in label[5:]:
                        self.assertGreater(l["tensor"] + l["fp32"] + l["fp64"], 0, (family, name, label))

    def test_gh200_is_the_h200_die_with_less_memory_bandwidth(self):
        # The same counted work on both: every label's compute and launch
        # time alike, its memory time 4.8/4.0 times the H200's (HBM3 at 4.0
        # TB/s against HBM3e at 4.8), to double rounding of one division.
        args = ("--synthetic", "small", "--batch", "4", "--directions", "2", "--predict-scale", "1")
        h, _ = predict(*args)
        g, last = predict(*args, gpu="gh200")
        self.assertTrue(last.startswith("predicted gh200: gradient "), last)
        for name in ("gradient", "second_order"):
            hl, gl = labels(h, name), labels(g, name)
            self.assertEqual(sorted(hl), sorted(gl))
            for label, l in hl.items():
                self.assertEqual((gl[label]["compute_s"], gl[label]["launch_s"]), (l["compute_s"], l["launch_s"]))
                self.assertAlmostEqual(gl[label]["memory_s"], l["memory_s"] * 4.8 / 4.0,
                                       delta=1e-14 * l["memory_s"], msg=label)
            self.assertGreater(g[name]["prediction"]["seconds_per_batch"], h[name]["prediction"]["seconds_per_batch"])

    def test_sharded_team_prices_its_collectives(self):
        # A team of one GH200 node's 4 GPUs with its vectors sliced over R:
        # a gradient batch gathers the weights twice and reduce-scatters the
        # gradient (3 x 4P bytes), a curvature batch gathers the weights and
        # K directions once ((1 + K) x 4P), each GPU receiving (R - 1)/R of
        # them over R - 1 NVLink peers of 150 GB/s (at most 450 GB/s).
        args = ("--synthetic", "small", "--batch", "4", "--directions", "2", "--predict-scale", "1")
        out = {}
        for R in (1, 2, 4):
            d, last = predict(*args, "--parameter-shards", str(R), gpu="gh200")
            self.assertTrue(last.startswith(f"predicted gh200 x4, parameter_shards {R}: gradient "), last)
            out[R] = d
        P = out[1]["sharded"]["memory_bytes"]["parameters"] / 4
        self.assertEqual(P, int(P))
        layers = 2  # the small preset's
        for R, d in out.items():
            sh = d["sharded"]
            g, v = sh["gradient_epoch"], sh["direction"]
            bandwidth = min(150e9 * (R - 1), 450e9)
            for pass_, moved in ((g, 3 * 4 * P), (v, 3 * 4 * P)):  # K = 2: 1 + K = 3
                want = moved * (R - 1) / R / bandwidth if R > 1 else 0.0
                # Two divisions and a product in double apart.
                self.assertAlmostEqual(pass_["communication_s_per_batch"], want, delta=1e-12 * want + 1e-300)
                c, x = pass_["compute_s_per_batch"], pass_["communication_s_per_batch"]
                self.assertAlmostEqual(pass_["exposed_s_per_batch"], max(0.0, x - c) + x / layers,
                                       delta=1e-12 * (c + x))
            # The batches split over the team's 4 GPUs; the compute is a GPU's own.
            self.assertEqual(g["compute_s_per_batch"], d["gradient"]["prediction"]["seconds_per_batch"])
            self.assertEqual(sh["batches_per_gpu"], math.ceil(d["gradient"]["prediction"]["batches_per_epoch"] / 4))
            mem = sh["memory_bytes"]
            self.assertAlmostEqual(mem["vectors"], out[1]["sharded"]["memory_bytes"]["vectors"] / R,
                                   delta=1e-12 * mem["vectors"])
            self.assertEqual(mem["gathered"] == 0, R == 1)
        self.assertEqual(out[1]["sharded"]["gradient_epoch"]["communication_share"], 0)
        r = subprocess.run([BENCH, "--predict", "gh200", "--no-probe", *args, "--parameter-shards", "3"],
                           capture_output=True, text=True, env=gnhtest.mpi_env())
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--parameter-shards 3 does not divide --gpus 4", r.stderr)

    def test_reference_prediction_and_launch_budget(self):
        d, last = predict("--synthetic", "reference", "--batch", "64")
        m = LAST.match(last)
        self.assertIsNotNone(m, last)
        gradient, K, second, launches = float(m.group(1)), int(m.group(2)), float(m.group(3)), int(m.group(4))
        self.assertEqual(K, 16)
        self.assertEqual(d["scale"], 32)
        self.assertEqual(d["batch"], 64)
        self.assertEqual(d["seq_len"], 1024)
        batches = math.ceil(10202112 / (64 * 1024))
        g, s = d["gradient"]["prediction"], d["second_order"]["prediction"]
        t = d["gradient_tf32"]["prediction"]
        self.assertEqual(g["batches_per_epoch"], batches)
        self.assertEqual(d["second_order"]["precision"], "bf16-amp")
        # The gradient under bf16-amp (the PyTorch pipeline's production
        # policy), the faster of it and TF32, which is priced beside it.
        self.assertEqual(d["gradient"]["precision"], "bf16-amp")
        self.assertEqual(d["gradient_tf32"]["precision"], "tf32")
        self.assertLess(g["seconds_per_batch"], t["seconds_per_batch"])
        # The gradient's bound: 6 s a full epoch on an H200 (the PyTorch
        # pipeline takes 28.7 s on its GPU).
        self.assertLessEqual(gradient, 6.0)
        # The second order's bound: 5 s a full-epoch direction at K = 16
        # under bf16-amp (the PyTorch pipeline: 32.73 s a direction in bf16).
        self.assertLessEqual(second, 5.0)
        self.assertEqual(launches, s["device_launches"])
        # The last line is the passes' per-batch time over the epoch, to its
        # three printed digits.
        self.assertAlmostEqual(gradient, g["seconds_per_batch"] * batches, delta=0.005 * gradient)
        self.assertAlmostEqual(second, s["seconds_per_batch"] * batches / K, delta=0.005 * second)
        for p in (g, s, t):
            # The stated launch budget: launches cost at most 5% of the pass.
            self.assertLessEqual(p["launch_share"], p["launch_budget"], p["pass"])
            self.assertLessEqual(p["launch_budget"], 0.05)
            # The labels add up to the pass.
            self.assertAlmostEqual(sum(l["seconds"] for l in p["labels"]), p["seconds_per_batch"],
                                   delta=1e-9 * p["seconds_per_batch"])
            self.assertEqual(sum(l["launches"] for l in p["labels"]), p["device_launches"])
        # The miniature's engines plan the full ones' attention chunks, head
        # tiles and causal query blocks (of 256 rows of the full context) a
        # batch (the adjoint cuts' gradient engine inside the second order
        # too), several of each where the full shape has them.
        for name in ("gradient", "second_order"):
            for engine, (full, mini) in d[name]["plans"].items():
                self.assertEqual(full, mini, (name, engine))
        self.assertIn("cut_gradient", d["second_order"]["plans"])
        # The second-order engine's attention is fused (bf16-amp, adjoint
        # cuts): no batched call, so one chunk of nothing; one launch a layer
        # in it and in the cut gradient engine's forward. Its head: 63 tiles
        # of 1,049 rows (2^25 values a plane, 35 planes).
        self.assertEqual(d["second_order"]["plans"]["engine"][0], [1, 63, 4, 256])
        self.assertEqual(labels(d, "second_order")["gnh::attention::fused::forward"]["launches"], 2 * 8)
        # Its directions in one walk of the keys a layer (y'' contracted with
        # the cut's adjoint as it is formed), and each row's heads summed
        # into the cut: one launch each a layer.
        self.assertEqual(labels(d, "second_order")["gnh::attention::fused::second_order"]["launches"], 8)
        self.assertEqual(labels(d, "second_order")["gnh::attention::fused::cut"]["launches"], 8)
        self.assertNotIn("gnh::attention::batched::softmax", labels(d, "second_order"))
        self.assertGreater(d["second_order"]["plans"]["cut_gradient"][0][1], 1)
        # The gradient pass with per-sequence norms takes every sequence's
        # gradient apart in the gradient engine's own reverse (the weight
        # products batched per sequence, the head's tiles split where
        # sequences begin), so it launches about as many kernels as the
        # gradient (a few more head pieces and one pass of squares) and costs
        # it little more. What it adds is the per-sequence gradients' own
        # traffic, which a faster gradient does not shrink: each weight
        # matrix's first product of a sequence writes its rows (beta 0, no C
        # read), the rest of the rows (norms, biases and wpe: 1.6% of them
        # at this shape) is zeroed by one kernel, and the squares pass reads
        # them once (and the batch's gradient, read and written once a group
        # of 16 sequences: 1.125 passes of a row a sequence, so the zeroing
        # moves 1.6% / 1.125 = 1.4% of its bytes). Predicted at 5.4% of the bf16-amp gradient and 2.6% of
        # TF32's (13% and 5.5% when the products added into zeroed rows and
        # the squares pass zeroed them again); under the 10% that keeps
        # analysis.per_sequence a default (analysis/settings.hpp). An engine
        # of one sequence, B times a batch, cost 2.4 times the gradient here.
        q = d["per_sequence"]["prediction"]
        self.assertEqual(d["per_sequence"]["plans"], d["gradient"]["plans"])
        self.assertLessEqual(q["seconds_per_batch"], 1.10 * g["seconds_per_batch"])
        self.assertGreater(q["seconds_per_batch"], g["seconds_per_batch"])
        self.assertLessEqual(q["device_launches"], g["device_launches"] + 16)
        per = {l["label"]: l for l in q["labels"]}
        self.assertEqual(per["gnh::pass::sequence_squares"]["launches"], 1)
        self.assertEqual(per["gnh::gpt::zero_accumulated"]["launches"], 1)
        self.assertLess(per["gnh::gpt::zero_accumulated"]["bytes"],
                        0.02 * per["gnh::pass::sequence_squares"]["bytes"])
        # The second order's projections after the norms (c_attn, c_fc) form
        # each direction's x'_k W^T + x V_k^T as one product of inner
        # dimension 2C from pair blocks (kernels/linear.hpp, pair_forward),
        # y'_k written once: 16 directions x 8 layers of (B T, 3C or 4C, 2C);
        # no product of their K stacked tangent planes is left.
        sl = labels(d, "second_order")
        pairs = {(sh["n"], sh["count"]) for sh in sl["gnh::gemm_batch"]["shapes"]
                 if sh["m"] == 64 * 1024 and sh["k"] == 2 * 320}
        self.assertEqual(pairs, {(3 * 320, 16 * 8), (4 * 320, 16 * 8)})
        self.assertFalse([sh for sh in sl["gnh::gemm"]["shapes"] if sh["m"] == 16 * 64 * 1024 and sh["n"] in (3 * 320, 4 * 320)])
        # The gradient's head forms each tile's logits once, its forward and
        # reverse together (kernels/lm_head_xent.hpp, lm_head_xent_gradient):
        # one (rows, C) by (C, V) product a tile, the plan's tiles a batch.
        def logits_products(name):
            return sum(sh["count"] for sh in labels(d, name)["gnh::gemm"]["shapes"]
                       if sh["n"] == 32000 and sh["k"] == 320)
        self.assertEqual(logits_products("gradient"), d["gradient"]["plans"]["engine"][0][1])
        self.assertEqual(logits_products("per_sequence"), d["gradient"]["plans"]["engine"][0][1])
        # The gradient's attention fused under bf16-amp: the forward and the
        # reverse's two kernels a layer, no batched products.
        gl = labels(d, "gradient")
        self.assertEqual(gl["gnh::attention::fused::forward"]["launches"], 8)
        self.assertEqual(gl["gnh::attention::fused::reverse"]["launches"], 2 * 8)
        self.assertNotIn("gnh::gemm_mapped", gl)
        # The gradient keeps its layers' linear inputs as their products read
        # them, rounded by the kernels that form them, so its reverse forms
        # no norm again (two a layer and the final one, in the forward
        # alone); and the reverse's adjoints are written rounded by the
        # kernels that form them too (the GELU's reverse, the fused
        # attention's, the residual stream's sums). What is left to round:
        # each head tile's h, and the adjoint the final norm's reverse leaves.
        self.assertEqual(gl["gnh::layernorm::forward"]["launches"], 2 * 8 + 1)
        tiles = d["gradient"]["plans"]["engine"][0][1]
        self.assertEqual(gl["gnh::gemm::round_bf16"]["launches"], tiles + 1)
        # Every dense, head and attention product on tensor cores at these
        # precisions.
        for p in (g, s, t):
            self.assertEqual(p["gemm_flops"]["fp32"], 0)
        self.assertGreater(s["gemm_flops"]["tensor"], g["gemm_flops"]["tensor"])

    def test_causal_blocks_do_five_eighths_of_the_square(self):
        # At the reference shape the attention's products go by 4 causal
        # query blocks of 256 rows: block j's scores against the keys up to
        # its end, its outputs from those columns, the key side from its
        # first row on. Each sums to (nb + 1) / (2 nb) = 5/8 of the whole
        # square's multiply-adds, exactly (integers), in 4 times the calls.
        # (The gradient at TF32 takes the batched products; the second order
        # under bf16-amp has none left: its forwards and its cut gradient's
        # reverse are fused, and plan no score planes.)
        blocked, _ = predict("--synthetic", "reference", "--batch", "64", "--precision", "tf32")
        square, _ = predict("--synthetic", "reference", "--batch", "64", "--precision", "tf32", "--attention-blocks", "1")
        for d in (blocked, square):
            s = labels(d, "second_order")
            self.assertFalse([l for l in s if "batched" in l or "gemm_mapped" in l], list(s))
            self.assertEqual(s["gnh::attention::fused::reverse"]["launches"], 2 * 8)
            self.assertEqual(d["second_order"]["plans"]["cut_gradient"][0][0], 1)
        name = "gradient"
        a, b = labels(blocked, name)["gnh::gemm_mapped"], labels(square, name)["gnh::gemm_mapped"]
        self.assertEqual(8 * a["tensor"], 5 * b["tensor"])
        self.assertEqual(a["launches"], 4 * b["launches"])
        self.assertEqual(blocked[name]["plans"]["engine"][0][2:], [4, 256])
        self.assertEqual(square[name]["plans"]["engine"][0][2:], [1, 1024])
        # Fewer bytes in the products and the row kernels, and a faster pass.
        self.assertLess(a["bytes"], b["bytes"])
        sm = "gnh::attention::batched::softmax_reverse"
        self.assertLess(labels(blocked, name)[sm]["bytes"], labels(square, name)[sm]["bytes"])
        self.assertLess(blocked[name]["prediction"]["seconds_per_batch"], square[name]["prediction"]["seconds_per_batch"])

    def test_gpt_neox_predicts_at_its_default_scale(self):
        # GPT-NeoX rotates a quarter of each head: at the reference's heads of
        # 64 a miniature of scale 16 (heads of 4) would rotate one dim, which
        # no model can; the default scale is the largest valid one, 8.
        d, last = predict("--synthetic", "reference", "--family", "gpt-neox", "--batch", "4")
        self.assertEqual((d["family"], d["scale"]), ("gpt-neox", 8))
        self.assertRegex(last, LAST)

    def test_bad_scale_is_one_line(self):
        r = subprocess.run([BENCH, "--predict", "h200", "--synthetic", "reference", "--batch", "64",
                            "--predict-scale", "3"], capture_output=True, text=True, env=gnhtest.mpi_env())
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("--predict-scale 3", r.stderr)
        r = subprocess.run([BENCH, "--predict", "a100", "--synthetic", "tiny", "--batch", "2"], capture_output=True,
                           text=True, env=gnhtest.mpi_env())
        self.assertEqual(r.returncode, 1)
        self.assertIn("knows h200", r.stderr)


if __name__ == "__main__":
    unittest.main()
