#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The device code a CUDA executable carries, without cuobjdump (which this
machine's CUDA toolkit lacks): reads the ELF's .nv_fatbin section and lists
each embedded image as `elf sm_90` (a cubin) or `ptx sm_90`.

    perf/device/fatbin_archs.py BINARY [--require sm_90]

Fatbin layout (as nvcc 11-13 write it): a run of fat binaries, each a 16-byte
header (magic 0xBA55ED50, version, header size, size of what follows) and
entries of a header (kind: 1 PTX, 2 ELF; header size; payload size; ...; the
SM version at byte 28) and payload. Exit 1 when --require is not met."""
import struct
import sys

MAGIC = 0xBA55ED50


def section(path, wanted):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit(f"{path}: not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    for s in sections:
        name = names[s[0]:names.index(b"\0", s[0])].decode()
        if name == wanted:
            return data[s[4]:s[4] + s[5]]
    return b""


def images(fatbin):
    out, at = [], 0
    while at + 16 <= len(fatbin):
        magic, _version, header, size = struct.unpack_from("<IHHQ", fatbin, at)
        if magic != MAGIC:
            break
        entry, end = at + header, at + header + size
        while entry + 32 <= end:
            kind, _v, eheader, payload = struct.unpack_from("<HHII", fatbin, entry)
            sm, = struct.unpack_from("<I", fatbin, entry + 28)
            out.append(({1: "ptx", 2: "elf"}.get(kind, f"kind{kind}"), f"sm_{sm}"))
            entry += eheader + payload
        at = end
        at += (-at) % 8
    return out


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--require"):
        raise SystemExit(__doc__)
    found = images(section(sys.argv[1], ".nv_fatbin"))
    for kind, sm in sorted(set(found)):
        print(f"{kind} {sm} x{found.count((kind, sm))}")
    if len(sys.argv) == 4 and not any(k == "elf" and sm == sys.argv[3] for k, sm in found):
        print(f"{sys.argv[1]}: no {sys.argv[3]} device code", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
