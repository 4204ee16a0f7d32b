#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The sm_90 build's kernel resources, checked before any GPU runs them.

    cmake/check-cuda-resources.py BUILD_DIR [--scratch SHAPE.json ...] [--table OUT.md]

Reads ptxas's resource report of every object of BUILD_DIR (OBJECT.ptxas,
kept by cmake/ptxas-log.sh under the gh200 preset's -Xptxas=-v): per kernel
its registers, spill stores and loads, stack frame and static shared memory.
Each --scratch file is `bench_engine --synthetic SHAPE --scratch`'s JSON: the
team scratch that the plan's fused attention kernels request for that
shape's heads. Fails (exit 1, one line per finding) when:

- a kernel of the analysis passes (gnh's, in namespace gnh; not the host's
  row and column loops, which a device never launches) spills registers to
  local memory;
- a fused attention kernel's static shared memory, the largest team scratch
  a shape requests of it and what Kokkos keeps beside a team ((team size + 2)
  doubles) exceed the shared memory of a block: 48 KB, as Kokkos 4 launches
  team kernels without opting in to more (227 KB is the most an sm_90 block
  can have with it); any other kernel's static shared memory over 48 KB (the
  other team kernels' requests do not depend on the shape and are not
  checked here);
- the fused attention kernels' registers and shared memory leave fewer warps
  resident on a multiprocessor than perf/cost_model.hpp assumes
  (kFusedAttentionMinWarps).

Prints a table of gnh's kernels (markdown; --table writes it to a file too)."""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# sm_90 (H100, H200): per multiprocessor and per block.
REGISTERS_PER_SM = 65536
REGISTER_UNIT = 8             # registers a thread are allocated in multiples of 8
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32
SHARED_PER_SM = 233472        # 228 KB
SHARED_RESERVED_PER_BLOCK = 1024
SHARED_BLOCK_DEFAULT = 49152  # without cudaFuncAttributeMaxDynamicSharedMemorySize
SHARED_BLOCK_OPTIN = 232448   # 227 KB

# The fused attention's teams: 2 warps (kernels/attention_fused.cpp: kR / 16
# rows of 32 lanes).
FUSED = ("FusedForward", "FusedSecond", "FusedReverseQueries", "FusedReverseKeys")
FUSED_TEAM_WARPS = 2
# The host's row and column loops (kernels/rows.hpp, colsum.hpp: RowShape::host),
# compiled into a CUDA build behind a run-time shape that a device never takes.
HOST_SHAPED = ("HostRows", "HostColumnSums")


def parse_reports(paths):
    """{mangled kernel name: resources}, the largest of each over the objects
    that compile it (a template instantiated in several units)."""
    kernels = {}
    entry = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)'")
    props = re.compile(r"^\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
    used = re.compile(r"ptxas info\s*: Used (\d+) registers(.*)")
    for path in paths:
        current = None
        with open(path, errors="replace") as f:
            for line in f:
                m = entry.search(line)
                if m:
                    current = m.group(1)
                    kernels.setdefault(current, {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0,
                                                 "smem": 0, "objects": set()})
                    kernels[current]["objects"].add(os.path.basename(path))
                    continue
                if current is None:
                    continue
                k = kernels[current]
                m = props.search(line)
                if m:
                    k["stack"] = max(k["stack"], int(m.group(1)))
                    k["spill_stores"] = max(k["spill_stores"], int(m.group(2)))
                    k["spill_loads"] = max(k["spill_loads"], int(m.group(3)))
                    continue
                m = used.search(line)
                if m:
                    k["registers"] = max(k["registers"], int(m.group(1)))
                    s = re.search(r"(\d+) bytes smem", m.group(2))
                    k["smem"] = max(k["smem"], int(s.group(1)) if s else 0)
                    current = None
    return kernels


def demangle(names):
    if not names:
        return {}
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, r.stdout.splitlines()))


def short_name(demangled):
    """The gnh type or function a kernel runs: its functor (a named struct) or
    the function whose KOKKOS_LAMBDA it is."""
    m = re.search(r"gnh::(?:[A-Za-z_]\w*::|\(anonymous namespace\)::)*[A-Za-z_]\w*", demangled)
    return m.group(0).replace("(anonymous namespace)::", "") if m else demangled[:60]


def fused_functor(demangled):
    for f in FUSED:
        if re.search(r"\b" + f + r"\b", demangled):
            return f
    return None


def resident_warps(registers, shared_per_block, warps_per_block):
    regs = -(-max(registers, 1) // REGISTER_UNIT) * REGISTER_UNIT
    by_regs = REGISTERS_PER_SM // (regs * 32 * warps_per_block)
    by_shared = SHARED_PER_SM // (shared_per_block + SHARED_RESERVED_PER_BLOCK) if shared_per_block else MAX_BLOCKS_PER_SM
    blocks = min(by_regs, by_shared, MAX_BLOCKS_PER_SM, MAX_WARPS_PER_SM // warps_per_block)
    return blocks * warps_per_block


def assumed_min_warps():
    text = open(os.path.join(ROOT, "perf", "cost_model.hpp")).read()
    m = re.search(r"kFusedAttentionMinWarps\s*=\s*(\d+)", text)
    if not m:
        sys.exit("check-cuda-resources: perf/cost_model.hpp has no kFusedAttentionMinWarps")
    return int(m.group(1))


def check(kernels, names, scratch, min_warps):
    findings, rows = [], []
    requests = {}  # functor -> (bytes, shape)
    for shape in scratch:
        for r in shape["requests"]:
            if r["bytes"] > requests.get(r["functor"], (0, ""))[0]:
                requests[r["functor"]] = (r["bytes"], shape["model"])
    for mangled, k in sorted(kernels.items(), key=lambda kv: short_name(names[kv[0]])):
        full = names[mangled]
        if "gnh::" not in full:
            continue  # Kokkos' and Kokkos Kernels' own kernels
        name = short_name(full)
        spills = k["spill_stores"] + k["spill_loads"]
        host_shaped = any(re.search(r"\b" + h + r"\b", name) for h in HOST_SHAPED)
        if spills and not host_shaped:
            findings.append(f"{name}: {k['spill_stores']} bytes of spill stores and {k['spill_loads']} of spill "
                            f"loads ({k['registers']} registers; {mangled} in {', '.join(sorted(k['objects']))})")
        functor = fused_functor(full)
        dynamic, shape, warps = 0, "", None
        if functor:
            dynamic, shape = requests.get(functor, (0, ""))
            block = k["smem"] + dynamic + (FUSED_TEAM_WARPS + 2) * 8
            if block > min(SHARED_BLOCK_DEFAULT, SHARED_BLOCK_OPTIN):
                findings.append(f"{name}: {block} bytes of shared memory a block ({k['smem']} static, {dynamic} "
                                f"of team scratch at {shape}, {(FUSED_TEAM_WARPS + 2) * 8} Kokkos's) exceed the "
                                f"{SHARED_BLOCK_DEFAULT} a block has without opting in")
            warps = resident_warps(k["registers"], block, FUSED_TEAM_WARPS)
            if warps < min_warps:
                findings.append(f"{name}: {warps} warps resident a multiprocessor ({k['registers']} registers, "
                                f"{block} bytes of shared memory a team of {FUSED_TEAM_WARPS} warps), below the "
                                f"{min_warps} perf/cost_model.hpp assumes")
        elif k["smem"] > SHARED_BLOCK_DEFAULT:
            findings.append(f"{name}: {k['smem']} bytes of static shared memory exceed {SHARED_BLOCK_DEFAULT}")
        rows.append((name + (" (host shape, not launched on a device)" if host_shaped else ""), k["registers"], k["spill_stores"], k["spill_loads"], k["stack"], k["smem"],
                     f"{dynamic} ({shape})" if functor else "", "" if warps is None else str(warps)))
    return findings, rows


def table(rows):
    # Kernels of one name (template instances) in one row: the largest of each column.
    merged = {}
    for r in rows:
        m = merged.setdefault(r[0], [r[0], 0, 0, 0, 0, 0, "", "", 0])
        for i in range(1, 6):
            m[i] = max(m[i], r[i])
        m[6] = m[6] or r[6]
        m[7] = r[7] if not m[7] or (r[7] and int(r[7]) < int(m[7])) else m[7]
        m[8] += 1
    out = ["| kernel (gnh functor or function) | instances | registers | spill stores / loads (B) | stack (B) "
           "| static shared (B) | team scratch (B, shape) | warps a multiprocessor |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m in merged.values():
        out.append(f"| {m[0]} | {m[8]} | {m[1]} | {m[2]} / {m[3]} | {m[4]} | {m[5]} | {m[6]} | {m[7]} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--scratch", action="append", default=[], help="bench_engine --scratch JSON of a shape")
    ap.add_argument("--table", help="write the table here too")
    a = ap.parse_args()
    reports = [os.path.join(d, f) for d, _, fs in os.walk(a.build_dir) for f in fs if f.endswith(".ptxas")]
    if not reports:
        sys.exit(f"check-cuda-resources: no ptxas reports (*.ptxas) under {a.build_dir}: build it with the gh200 "
                 "preset (its launcher cmake/ptxas-log.sh keeps them)")
    kernels = parse_reports(reports)
    if not kernels:
        sys.exit(f"check-cuda-resources: {len(reports)} ptxas report(s) under {a.build_dir} name no kernel "
                 "(was -Xptxas=-v in the flags?)")
    scratch = []
    for path in a.scratch:
        with open(path) as f:
            scratch.append(json.load(f))
    findings, rows = check(kernels, demangle(list(kernels)), scratch, assumed_min_warps())
    text = table(rows)
    print(text, end="")
    if a.table:
        with open(a.table, "w") as f:
            f.write(text)
    print(f"check-cuda-resources: {len(kernels)} kernels in {len(reports)} report(s), {len(rows)} of gnh's")
    for line in findings:
        print(f"check-cuda-resources: {line}", file=sys.stderr)
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
