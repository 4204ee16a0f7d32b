#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Regenerates the parser's fixtures from tests/cuda/spill_kernel.cu with the
# CUDA toolkit's nvcc: its ptxas resource report with registers capped at 32
# (spilled/spill_kernel.o.ptxas) and uncapped (clean/spill_kernel.o.ptxas).
set -euo pipefail
cd "$(dirname "$0")"
for variant in spilled clean; do
  cap=""
  [ "$variant" = spilled ] && cap="-maxrregcount=32"
  mkdir -p "reports/$variant"
  # shellcheck disable=SC2086
  nvcc -arch=sm_90 -Xptxas=-v $cap -c spill_kernel.cu -o /dev/null 2>&1 |
    grep -E '^(ptxas info +:|    [0-9]+ bytes stack frame)' > "reports/$variant/spill_kernel.o.ptxas"
done
