#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Makes perf/device/reference_fp64.json, the float64 values the GPU check
# validates against: the host build's bench_engine in double on the reference
# model (synthetic, splitmix64-drawn: the same numbers on every machine), 2
# sequences of 1024 tokens, loss, |G|^2 and v^T H v of 16 Rademacher
# directions (seed 1234) by the second-order forward with adjoint cuts and a
# head of 4 x 8 tiles, and by forward-over-reverse (which also gives |Hv|).
# It must use the options of run.sh's validate step (CONFIG, VBATCH, VK,
# HEAD_TILE). About 10 minutes and 10 GB on one core.
#
#   perf/device/make_reference.sh [BENCH]     # default build/bin/bench_engine
set -euo pipefail
cd "$(dirname "$0")/../.."
bench="${1:-build/bin/bench_engine}"
out=perf/device/reference_fp64.json
"$bench" --synthetic reference --batch 2 --directions 16 --precision fp64 --repeats 0 --validation \
  --adjoint-cuts 1 --head-tile 512,4096 --no-probe > "$out.tmp"
mv "$out.tmp" "$out"
echo "make_reference: wrote $out"
