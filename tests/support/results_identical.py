#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Are two gnh results files the same, bit for bit, in everything a result is?

Compares every group, attribute and dataset of A and B by their bytes (NaN
equals NaN only with the same bit pattern). What legitimately differs between
two runs of one deck is skipped and listed: wall-clock timings, memory
figures, the commit and build strings, the GEMM probe's timings.

    /usr/bin/python3 tests/support/results_identical.py A.h5 B.h5
Exit 0 when identical, 1 with the differences listed.
"""
import sys

import h5py
import numpy as np

# Names whose values are measurements of the run, not results.
VOLATILE = {"timings", "timing_stages", "peak_memory_bytes", "git_commit", "build", "gnh_version",
            "host_gemm_probe", "created"}


def items(f):
    out = {}

    def visit(name, obj):
        out[name] = obj
    f.visititems(visit)
    out["/"] = f
    return out


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "fciub":
        return a.tobytes() == b.tobytes()
    return bool(np.all(a == b))


def main(pa, pb):
    diffs, skipped = [], set()
    with h5py.File(pa, "r") as fa, h5py.File(pb, "r") as fb:
        ia, ib = items(fa), items(fb)
        for name in sorted(set(ia) | set(ib)):
            leaf = name.rsplit("/", 1)[-1]
            if leaf in VOLATILE:
                skipped.add(leaf)
                continue
            if name not in ia or name not in ib:
                diffs.append(f"{name}: only in {'A' if name in ia else 'B'}")
                continue
            oa, ob = ia[name], ib[name]
            if isinstance(oa, h5py.Dataset) != isinstance(ob, h5py.Dataset):
                diffs.append(f"{name}: dataset in one, group in the other")
                continue
            if isinstance(oa, h5py.Dataset) and not same(oa[()], ob[()]):
                diffs.append(f"{name}: values differ")
            for k in sorted(set(oa.attrs) | set(ob.attrs)):
                if k in VOLATILE:
                    skipped.add(k)
                    continue
                if k not in oa.attrs or k not in ob.attrs:
                    diffs.append(f"{name}@{k}: only in {'A' if k in oa.attrs else 'B'}")
                elif not same(oa.attrs[k], ob.attrs[k]):
                    diffs.append(f"{name}@{k}: {oa.attrs[k]!r} != {ob.attrs[k]!r}")
    for d in diffs:
        print(d)
    print(f"{len(ia)} objects compared; skipped as run measurements: {', '.join(sorted(skipped)) or 'none'}")
    print("identical" if not diffs else f"{len(diffs)} difference(s)")
    return 0 if not diffs else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
