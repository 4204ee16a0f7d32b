#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The GPU check: one bounded command on a GPU machine that builds nothing
# there and brings back a complete picture in at most 4 files:
#
#   perf/device/prepare.sh              # on a build machine: build-device/bin/bench_engine (sm_90)
#   perf/device/run.sh [--out DIR]      # on the GPU machine
#   perf/device/run.sh --rehearse       # on the build machine: every step, host build, tiny preset
#
# Steps, each under its own time limit and all within --deadline seconds
# (default 470): when one fails or overruns, the others still run where they
# can and the summary names it with its error.
#   machine    OS release, GPU and driver (nvidia-smi), bench_engine's ldd and
#              the glibc it needs; CUDA libraries missing from the system
#              paths are taken from the Python CUDA wheels (nvidia/*/lib under
#              site-packages) through LD_LIBRARY_PATH
#   ceilings   a large GEMM in bf16, TF32 and fp32 and a device-to-device copy
#              (torch_seed.py ceilings)
#   validate   the reference model (8 layers, 5 heads of 64, d 320, vocab
#              32000, T 1024) on 2 sequences: second-order forward at K = 16
#              with adjoint cuts and a multi-tile head, and forward-over-
#              reverse at the same directions, in fp32, tf32 and bf16-amp
#              (engine workspaces NaN-poisoned), against each other and
#              against float64 values of the host build (reference_fp64.json,
#              made by make_reference.sh)
#   time-*     per precision (bf16-amp, tf32, fp32): the gradient, second-order
#              forward at K = 1 and 16 (batch 64), forward-over-reverse at K = 1
#              and 4 (batch 16): a warm-up and the median of 5 fenced repeats,
#              the measured memory high-water mark, one profiled run per pass
#              (time and launches per kernel label); values of the timed batch
#              for the PyTorch comparison
#   torch      the seed's method on the same model, tokens and direction:
#              eager gradient, compiled forward-over-reverse HVP (bf16
#              autocast, TF32; compile time apart), eager double backward;
#              values checked against gnh's (torch_seed.py seed)
#   summary    summary.json and summary.txt (summarize.py), printed last
# Files in the output folder: summary.txt, summary.json, run.log and
# raw.tar.gz (every step's JSON and log). The output folder is --out, else
# $OUT, else perf/device/out-<UTC time>.
#
# options: --bench PATH       the bench_engine to run (default build-device/bin/bench_engine;
#                             --rehearse: build/bin/bench_engine)
#          --deadline S       the whole check's time limit in seconds
#          --fail-step STEP   make STEP fail (tests of the summary's error path)
#          --python PATH      the interpreter with torch (default python3; --rehearse:
#                             /usr/bin/python3 where it exists)
set -uo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
HERE="$(dirname "$SELF")"
ROOT="$(cd "$HERE/../.." && pwd)"

if [ "${1:-}" = "--step" ]; then
  # One step, run by the driver below under `timeout` with the settings in
  # its environment; writes into $WORK.
  step="$2"
  cd "$WORK"
  bench() { "$BENCH" --synthetic "$CONFIG" "$@"; }
  case "$step" in
    machine)
      {
        echo "== date"; date -u
        echo "== os-release"; cat /etc/os-release 2>/dev/null || uname -a
        echo "== uname"; uname -a
        echo "== nvidia-smi"; nvidia-smi 2>&1 || echo "(no nvidia-smi)"
        echo "== cpu"; (lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)") || true
        echo "== bench_engine"; ls -l "$BENCH"
        echo "== ldd"; ldd "$BENCH" 2>&1 || true
        echo "== glibc required"
        (objdump -T "$BENCH" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1) || echo "(objdump missing)"
        echo "== glibc here"; (ldd --version 2>&1 | head -1) || true
        echo "== LD_LIBRARY_PATH"; echo "${LD_LIBRARY_PATH:-}"
        echo "== library note"; cat "$WORK/libraries.txt" 2>/dev/null || true
      } > machine.txt 2>&1
      cat machine.txt
      if [ -s "$WORK/missing.txt" ]; then
        echo "bench_engine needs libraries this machine lacks: $(cat "$WORK/missing.txt")" >&2
        exit 1
      fi
      ;;
    ceilings)
      "$PY" "$HERE/torch_seed.py" ceilings ceilings.json --size "$GEMM_N" --copy-bytes "$COPY_BYTES"
      ;;
    validate)
      if [ "$REHEARSE" = 1 ]; then
        # The host build is the float64 reference of its own preset.
        bench --batch "$VBATCH" --directions "$VK" --precision fp64 --repeats 0 --validation --no-probe \
          --adjoint-cuts 1 --head-tile "$HEAD_TILE" > reference_fp64.json || exit 1
      else
        cp "$HERE/reference_fp64.json" reference_fp64.json
      fi
      mkdir -p case
      rc=0
      for p in fp32 tf32 bf16-amp; do
        dump=()
        [ "$p" = fp32 ] && dump=(--dump case --dump-batch "$TBATCH")
        bench --batch "$VBATCH" --directions "$VK" --precision "$p" --repeats 0 --validation --no-probe \
          --adjoint-cuts 1 --head-tile "$HEAD_TILE" "${dump[@]}" > "validate_$p.json" || { rc=1; continue; }
        "$PY" "$HERE/summarize.py" validate reference_fp64.json "validate_$p.json" --precision "$p" || rc=1
      done
      exit $rc
      ;;
    predict)
      # The cost model's prediction of the timed passes (the gradient under
      # bf16-amp and in TF32, the second order at K = 16 under bf16-amp) at the timing batch,
      # label by label, for the summary to set beside the measured profile.
      bench --batch "$TBATCH" --predict h200 --no-probe > predict.txt || exit 1
      tail -1 predict.txt
      ;;
    time-*)
      p="${step#time-}"
      bench --batch "$TBATCH" --passes gradient,sequence,curvature --methods second-order-forward --directions 1,16 \
        --repeats "$REPEATS" --precision "$p" --profile --validation --no-probe > "time_sof_$p.json" || exit 1
      bench --batch "$FBATCH" --passes curvature --methods forward-over-reverse --directions 1,4 \
        --repeats "$REPEATS" --precision "$p" --profile --no-probe > "time_for_$p.json" || exit 1
      ;;
    torch)
      [ -f case/model.json ] || { echo "no case: the validate step did not dump one" >&2; exit 1; }
      "$PY" "$HERE/torch_seed.py" seed case torch.json --batch "$TBATCH" --repeats "$REPEATS" \
        --check-fp32 validate_fp32.json --check-batch "$VBATCH" --check-bf16 time_sof_bf16-amp.json
      ;;
    *) echo "run.sh: unknown step '$step'" >&2; exit 2 ;;
  esac
  exit $?
fi

REHEARSE=0
OUT_DIR=""
BENCH=""
DEADLINE=""
FAIL_STEP="${GNH_DEVICE_FAIL_STEP:-}"
PY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) REHEARSE=1; shift ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --bench) BENCH="$2"; shift 2 ;;
    --deadline) DEADLINE="$2"; shift 2 ;;
    --fail-step) FAIL_STEP="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    -h|--help) sed -n '3,48p' "$SELF" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
OUT_DIR="${OUT_DIR:-${OUT:-$ROOT/perf/device/out-$(date -u +%Y%m%dT%H%M%S)}}"
mkdir -p "$OUT_DIR" || { echo "run.sh: cannot create the output folder $OUT_DIR" >&2; exit 1; }
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
exec > >(tee -a "$OUT_DIR/run.log") 2>&1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gnh-device.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

if [ "$REHEARSE" = 1 ]; then
  # Every step on the host build at the tiny preset: the same files, steps
  # and limits on a scale that takes a minute, with the host's PyTorch.
  BENCH="${BENCH:-$ROOT/build/bin/bench_engine}"
  [ -n "$PY" ] || { [ -x /usr/bin/python3 ] && PY=/usr/bin/python3; }
  CONFIG=tiny VBATCH=2 VK=16 HEAD_TILE=8,16 TBATCH=4 FBATCH=2 REPEATS=5 GEMM_N=256 COPY_BYTES=$((16 << 20))
  DEADLINE="${DEADLINE:-240}"
  LIMITS="machine=20 ceilings=60 validate=60 predict=30 time-bf16-amp=60 torch=90 time-tf32=60 time-fp32=60"
else
  BENCH="${BENCH:-$ROOT/build-device/bin/bench_engine}"
  # Validation: 2 sequences, 4 row tiles of 512 and 8 vocabulary chunks of
  # 4096 in the head. Timing: the seed's batch of 64 sequences; forward-over-
  # reverse at 16 (it keeps every layer for 1 + K planes).
  CONFIG=reference VBATCH=2 VK=16 HEAD_TILE=512,4096 TBATCH=64 FBATCH=16 REPEATS=5 GEMM_N=8192 COPY_BYTES=$((4 << 30))
  DEADLINE="${DEADLINE:-470}"
  LIMITS="machine=20 ceilings=40 validate=90 predict=20 time-bf16-amp=110 torch=150 time-tf32=90 time-fp32=90"
fi
PY="${PY:-python3}"
REHEARSE_FLAG=$REHEARSE
export WORK BENCH PY CONFIG VBATCH VK HEAD_TILE TBATCH FBATCH REPEATS GEMM_N COPY_BYTES
export REHEARSE="$REHEARSE_FLAG" OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
T_END=$((SECONDS + DEADLINE))
RESERVE=15  # seconds kept for the summary

echo "run.sh: output folder $OUT_DIR, deadline ${DEADLINE} s, bench_engine $BENCH, python $PY"

# Libraries: what ldd cannot find, looked up in the Python CUDA wheels.
: > "$WORK/missing.txt"
if [ -x "$BENCH" ]; then
  missing() { { ldd "$BENCH" 2>/dev/null || true; } | sed -n 's/^[[:space:]]*\([^ ]*\) => not found$/\1/p' | tr '\n' ' '; }
  m="$(missing)"
  if [ -n "$m" ]; then
    wheel_dirs="$("$PY" - 2>/dev/null <<'PYEOF'
import glob, os, site
dirs = []
for s in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += sorted(glob.glob(os.path.join(s, "nvidia", "*", "lib")))
print(":".join(dirs))
PYEOF
)"
    if [ -n "$wheel_dirs" ]; then
      export LD_LIBRARY_PATH="$wheel_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "libraries missing from the system paths ($m) taken from the Python CUDA wheels: $wheel_dirs" \
        | tee "$WORK/libraries.txt"
    fi
    missing > "$WORK/missing.txt"
  fi
else
  echo "$BENCH (missing or not executable: build it with perf/device/prepare.sh and carry it, or pass --bench)" \
    > "$WORK/missing.txt"
fi

: > "$WORK/steps.jsonl"
run_step() {
  local name="$1" limit="$2" t0=$SECONDS status=ok rc=0 left
  left=$((T_END - SECONDS - RESERVE))
  [ "$limit" -gt "$left" ] && limit=$left
  printf '\n== step %s (limit %s s)\n' "$name" "$limit"
  if [ "$limit" -lt 5 ]; then
    status=skipped
    echo "no time left before the deadline" > "$WORK/$name.err"
  elif [ "$FAIL_STEP" = "$name" ]; then
    status=failed rc=1
    echo "forced failure (--fail-step $name)" | tee "$WORK/$name.err"
  elif [ "$name" != machine ] && [ "$name" != ceilings ] && [ "$name" != torch ] && [ -s "$WORK/missing.txt" ]; then
    status=skipped
    echo "bench_engine cannot run here: $(cat "$WORK/missing.txt")" | tee "$WORK/$name.err"
  else
    timeout -k 5 "$limit" bash "$SELF" --step "$name" 2> "$WORK/$name.err"
    rc=$?
    cat "$WORK/$name.err" >&2
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      status=timeout
      echo "overran its limit of $limit s" >> "$WORK/$name.err"
    elif [ $rc -ne 0 ]; then
      status=failed
    fi
  fi
  "$PY" - "$WORK/steps.jsonl" "$name" "$status" "$rc" "$((SECONDS - t0))" "$limit" "$WORK/$name.err" <<'PYEOF' \
    || echo "{\"step\": \"$name\", \"status\": \"$status\", \"rc\": $rc}" >> "$WORK/steps.jsonl"
import json, sys
path, name, status, rc, secs, limit, err = sys.argv[1:]
lines = [l.strip() for l in open(err, errors="replace")] if status != "ok" else []
lines = [l for l in lines if l]
rec = {"step": name, "status": status, "rc": int(rc), "seconds": int(secs), "limit": int(limit),
       "error": lines[-1] if lines else ""}
open(path, "a").write(json.dumps(rec) + "\n")
PYEOF
  echo "== step $name: $status ($((SECONDS - t0)) s)"
}

for entry in $LIMITS; do
  run_step "${entry%%=*}" "${entry#*=}"
done

printf '\n== summary\n'
rm -rf "$WORK/case"  # the dumped model: large, and remade from the seed
tar czf "$OUT_DIR/raw.tar.gz" -C "$WORK" . 2>/dev/null || echo "run.sh: could not write $OUT_DIR/raw.tar.gz" >&2
if ! "$PY" "$HERE/summarize.py" summary "$WORK" "$OUT_DIR" --rehearse "$REHEARSE_FLAG" > /dev/null 2> "$WORK/summary.err"; then
  # Standard library only, but the interpreter may be what failed: say so.
  { echo "summary: summarize.py failed: $(tail -1 "$WORK/summary.err")"; cat "$WORK/steps.jsonl"; } > "$OUT_DIR/summary.txt"
fi
cat "$OUT_DIR/summary.txt"
grep -q '"status": "ok"' "$WORK/steps.jsonl" || exit 1
if grep -q -E '"status": "(failed|timeout|skipped)"' "$WORK/steps.jsonl" || grep -q '^RESULT: FAIL' "$OUT_DIR/summary.txt"; then
  exit 1
fi
exit 0
