#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The gh200 preset's compiler launcher: runs the compile command (whose flags
# ask ptxas for its resource report, -Xptxas=-v) and keeps that report of each
# object beside it, as OBJECT.ptxas (registers, spill stores and loads, stack,
# static shared memory per kernel; cmake/check-cuda-resources.py reads them).
# Every other line of the compiler's stderr passes through unchanged.
set -uo pipefail
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out="$a"
  prev="$a"
done
err="$(mktemp)"
"$@" 2> "$err"
rc=$?
report='^(ptxas info +:|    [0-9]+ bytes stack frame)'
if [ -n "$out" ]; then
  grep -E "$report" "$err" > "$out.ptxas" || true
fi
grep -Ev "$report" "$err" >&2 || true
rm -f "$err"
exit $rc
