# SPDX-License-Identifier: BSD-3-Clause
"""Read PyTorch checkpoints and safetensors files without PyTorch.

:func:`load` recognises the format by content, not by name:

* ``torch.save``'s zip archive (``<prefix>/data.pkl``, storages in
  ``<prefix>/data/<key>``, optional ``<prefix>/byteorder``);
* ``torch.save``'s legacy stream (``_use_new_zipfile_serialization=False``):
  magic number, protocol version 1001 and sys_info pickles, the main pickle,
  the list of storage keys, then per key an 8-byte little-endian element
  count and the raw elements;
* a safetensors file (8-byte little-endian header length, JSON header,
  one contiguous data buffer).

Pickles go through :class:`_Unpickler`, whose ``find_class`` knows only an
allow-list of names (tensor and parameter rebuild functions, typed storage
classes, ``collections.OrderedDict``), each implemented here on numpy.  Any
other global is refused with its name before anything is called.  Before a
pickle is unpickled, :func:`_scan` walks its opcodes without running them and
refuses the extension-registry opcodes (EXT1/2/4, whose look-up can bypass
``find_class``) and the shapes of pickle that exhaust the interpreter.
Tensors come back as :class:`Tensor`: the source dtype and a zero-copy view
of the file, which is mapped read-only and hashed in blocks, never read
whole.  ``Tensor.array`` copies the values out (bfloat16 widened exactly to
float32); ``Tensor.blocks`` hands them out a block of rows at a time and
gives the pages it read back to the kernel, so a converter's memory does
not grow with the model.  A zip record's CRC-32 is checked when its bytes
are first read.

Limits, each far beyond what ``torch.save`` writes for a model, so that a
hostile file is refused with a message instead of crashing or exhausting
the process:

* :data:`MAX_DIMS` (16) dimensions per tensor, and sizes, strides and
  offsets integers in [0, 2^63), all checked before numpy sees them.  numpy
  refuses more than 32 dimensions and its C code overflows a stack buffer
  beyond 64; GPT weights have at most 2, nanoGPT's mask buffer 4.  Views
  are built with ``np.ndarray(buffer=...)``, which checks their extent.
* :data:`MAX_NESTING` (100) levels of containers (tuples, lists, dicts,
  sets, rebuilt objects) in a pickle, counted by :func:`_scan`.  CPython
  hashes a nested tuple recursively in C, so a dict key a million tuples
  deep overflows the C stack; torch's pickles nest 8 or 9 levels.  A
  container may not be modified after it was put into another one (as a
  cyclic structure is built), which would make the count meaningless.
* BUILD may give an OrderedDict its ``_metadata`` (a dict), as torch does
  for a state_dict, and nothing else: no attribute can shadow a method.
* Memo indices: each PUT must use the next free index (as every pickler
  does) and each GET an index already put, so that a single opcode cannot
  make the unpickler allocate a memo table of gigabytes.
* A tensor may not have more elements than its storage (a broadcast view,
  stride 0, would be copied to its full size), and all tensors together may
  not view more than twice the file's size plus :data:`MATERIALISE_SLACK`
  (64 MiB), counted when the file is loaded: real checkpoints view about the
  file's size, plus a storage shared by tied weights once more.
* Zip archives: storage records must be stored uncompressed (torch.save
  never compresses them) and have exactly the declared size, checked before
  anything is read; data.pkl may not exceed :data:`MAX_PICKLE_BYTES`
  (64 MiB).  A zip bomb is refused without being inflated.
* safetensors headers are at most :data:`MAX_SAFETENSORS_HEADER` bytes (the
  format's own limit, 100 MB).

:func:`load` raises only :class:`PtFileError`; its message is one line, and
every name taken from the file goes through :func:`printable` or
:func:`describe`, so that it cannot break the line or send terminal escapes.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import math
import mmap
import os
import pickle
import pickletools
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["PtFileError", "Tensor", "Loaded", "load", "equal", "printable", "describe",
           "LEGACY_MAGIC", "MAX_DIMS", "MAX_NESTING", "MAX_PICKLE_BYTES",
           "MATERIALISE_SLACK", "MAX_SAFETENSORS_HEADER"]

#: First object of the legacy (non-zip) ``torch.save`` stream.
LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
LEGACY_PROTOCOL = 1001
#: Most dimensions a tensor may have.
MAX_DIMS = 16
#: Deepest nesting of containers a pickle may build.
MAX_NESTING = 100
#: Largest data.pkl accepted from a zip archive.
MAX_PICKLE_BYTES = 64 << 20
#: Bytes that tensors may copy out beyond twice the file's size.
MATERIALISE_SLACK = 64 << 20
#: Largest safetensors JSON header (the format's own limit).
MAX_SAFETENSORS_HEADER = 100_000_000
#: Bytes of a tensor copied out of the file at a time by Tensor.blocks.
BLOCK_BYTES = 16 << 20
#: A tensor's copy is kept by Tensor.array up to this size (scalars, steps).
CACHED_BYTES = 1 << 20
_INDEX_LIMIT = 1 << 63  # sizes, strides, offsets and counts are int64 in torch
_NOT_WEIGHTS = "not a tensor, storage or plain container"


class PtFileError(Exception):
    """The file cannot be read safely; the message is one line."""


@dataclass(frozen=True)
class _DType:
    name: str          # PyTorch's name: float32, bfloat16, int64, ...
    stored: str        # numpy dtype of one stored element, little-endian
    floating: bool


_DTYPES = {d.name: d for d in (
    _DType("float64", "<f8", True), _DType("float32", "<f4", True),
    _DType("float16", "<f2", True), _DType("bfloat16", "<u2", True),
    _DType("int64", "<i8", False), _DType("int32", "<i4", False),
    _DType("int16", "<i2", False), _DType("int8", "i1", False),
    _DType("uint8", "u1", False), _DType("bool", "?", False))}


# --------------------------------------------------------------------------- #
# Names and values from the file, in one-line messages
# --------------------------------------------------------------------------- #
def printable(text: object, limit: int = 80) -> str:
    """A name from the file, safe to put in a one-line message.

    A printable string of at most ``limit`` characters comes back as it is;
    anything else as the ``repr`` of its first ``limit`` characters (control
    characters, newlines and escapes written as backslash sequences), with
    ``...`` when cut.
    """
    text = text if isinstance(text, str) else str(text)
    if len(text) <= limit and text.isprintable():
        return text
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def describe(value: object, limit: int = 80) -> str:
    """A value from the file, safe to put in a one-line message.

    Scalars as their ``repr`` (strings escaped and cut, integers of more than
    64 bits by their size), tensors by dtype and shape, containers by type
    and length; never a recursive ``repr``.
    """
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        bits = value.bit_length()
        return str(value) if bits <= 64 else f"an integer of {bits} bits"
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    if isinstance(value, Tensor):
        return repr(value)
    if isinstance(value, (bytes, bytearray, tuple, list, dict, set, frozenset)):
        return f"{_a(type(value).__name__)} of {len(value)} items"
    return _a(type(value).__name__)


def _key_text(key: object) -> str:
    """A container key from the file as one element of a tensor's path."""
    return printable(key) if isinstance(key, str) else describe(key)


def _index(value: object) -> bool:
    """True for an int (not bool) in [0, 2**63), torch's range for sizes."""
    return isinstance(value, int) and not isinstance(value, bool) \
        and 0 <= value < _INDEX_LIMIT


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _dims_text(dims) -> str:
    """A short sequence of numbers from the file, as a tuple or list."""
    if not isinstance(dims, (tuple, list)) or len(dims) > MAX_DIMS:
        return describe(dims)
    text = ", ".join(describe(d) for d in dims)
    if isinstance(dims, list):
        return f"[{text}]"
    return f"({text},)" if len(dims) == 1 else f"({text})"


def _dims_problem(what: str, dims: object) -> Optional[str]:
    """Why ``dims`` is not a valid size or stride tuple, or None."""
    if not isinstance(dims, (tuple, list)):
        return f"{what} is {describe(dims)}, not a tuple"
    if len(dims) > MAX_DIMS:
        return (f"{what} has {len(dims)} dimensions, more than the {MAX_DIMS} "
                f"this reader supports")
    if not all(_index(d) for d in dims):
        return f"{what} {_dims_text(dims)} is not a tuple of integers in [0, 2^63)"
    return None


# --------------------------------------------------------------------------- #
# Storages and tensors
# --------------------------------------------------------------------------- #
class _StorageType:
    """Stands for ``torch.FloatStorage`` etc. in a pickle: a dtype, no code."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: str) -> None:
        self.name, self.dtype = name, _DTYPES[dtype]

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    def __setstate__(self, state) -> None:
        raise PtFileError(f"refusing BUILD on {self!r} (a storage type has no state)")


class _Storage:
    """One storage record: ``numel`` elements of ``dtype``.

    ``data`` is set once the record is found: a zero-copy slice of the file's
    mapping (or of bytes given in memory).  ``start`` is its byte offset in
    the mapping ``mapped``, so that pages read can be handed back; ``crc`` is
    the zip record's CRC-32, checked the first time the bytes are read.
    """

    __slots__ = ("key", "dtype", "numel", "data", "big_endian", "mapped", "start",
                 "crc")

    def __init__(self, key: str, dtype: _DType, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel
        self.data: Optional[memoryview] = None
        self.big_endian = False
        self.mapped: Optional[mmap.mmap] = None
        self.start = 0
        self.crc: Optional[int] = None

    def __setstate__(self, state) -> None:
        raise PtFileError(f"refusing BUILD on storage {printable(self.key)}")

    def release(self, lo: int, hi: int) -> None:
        """Hand back the mapped pages of bytes [lo, hi) of the record: they
        were read, and a converter reading a file larger than memory must not
        keep them resident."""
        if self.mapped is None or hi <= lo:
            return
        begin = (self.start + lo) // mmap.PAGESIZE * mmap.PAGESIZE
        self.mapped.madvise(mmap.MADV_DONTNEED, begin, self.start + hi - begin)

    def verify(self) -> None:
        """Check the zip record's CRC-32 (once), reading it in blocks."""
        if self.crc is None:
            return
        crc, n = 0, len(self.data)
        for lo in range(0, n, BLOCK_BYTES):
            crc = zlib.crc32(self.data[lo:lo + BLOCK_BYTES], crc)
            self.release(lo, min(n, lo + BLOCK_BYTES))
        self.check_crc(crc)

    def check_crc(self, crc: int) -> None:
        if crc != self.crc:
            raise PtFileError(f"corrupt zip archive: storage record {printable(self.key)} "
                              f"fails its CRC-32 check")
        self.crc = None


class _Budget:
    """Bytes that tensors may still copy out of their storages."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.left = self.limit = limit

    def take(self, nbytes: int, where: Callable[[], str]) -> None:
        if nbytes > self.left:
            raise PtFileError(
                f"{where()}: copying its {nbytes} bytes would take the "
                f"tensors past {self.limit} bytes, twice the file's size plus "
                f"{MATERIALISE_SLACK >> 20} MiB (storages viewed many times over?)")
        self.left -= nbytes


class Tensor:
    """A tensor read from a file.

    ``dtype`` is the source dtype's PyTorch name.  The values are not copied
    when the file is read: ``array`` copies them out on each use (native byte
    order; float16/32/64, integers, bool; bfloat16 widened exactly to
    float32), and :meth:`blocks` hands them out a block of leading rows at a
    time, so that a tensor never needs to be held whole.  Tensors from pickles
    are resolved after every storage is found; until then ``array`` raises.
    """

    __slots__ = ("dtype", "shape", "_array", "_view", "_storage", "_offset", "_stride")

    def __init__(self, dtype: str, shape: Tuple[int, ...],
                 array: Optional[np.ndarray] = None,
                 storage: Optional[_Storage] = None, offset: int = 0,
                 stride: Tuple[int, ...] = ()) -> None:
        self.dtype, self.shape = dtype, shape
        self._array, self._storage = array, storage
        self._view: Optional[np.ndarray] = None
        self._offset, self._stride = offset, stride

    @property
    def is_floating(self) -> bool:
        return _DTYPES[self.dtype].floating

    @property
    def array(self) -> np.ndarray:
        """The values, copied out of the file (a tensor of at most
        :data:`CACHED_BYTES` keeps its copy)."""
        if self._array is not None:
            return self._array
        if self._view is None:
            raise PtFileError("tensor used before its storage was read")
        if self._view.ndim == 0 or not self._view.flags.c_contiguous:
            self._storage.verify()
            arr = self._widen(self._view)
            self._storage.release(0, len(self._storage.data))
        else:
            arr, row = None, 0
            for block in self.blocks():
                if arr is None:
                    arr = np.empty(self.shape, dtype=block.dtype)
                arr[row:row + len(block)] = block
                row += len(block)
        if arr.nbytes <= CACHED_BYTES:
            self._array, self._view = arr, None
        return arr

    def blocks(self, max_bytes: int = BLOCK_BYTES, rows: Optional[int] = None):
        """The values as consecutive blocks of leading rows, each a fresh
        array of ``rows`` rows or at most about ``max_bytes`` (at least one
        row); a 0-d tensor is one block.  The pages of the file a block was read from are handed
        back once it is copied, and a zip record's CRC-32 is checked."""
        if self._array is not None or self._view is None or self._view.ndim == 0 \
                or not self._view.flags.c_contiguous:
            whole = self.array
            if whole.ndim == 0:
                yield whole
                return
            step = rows or max(1, max_bytes // max(1, whole[:1].nbytes))
            for lo in range(0, whole.shape[0], step):
                yield whole[lo:lo + step]
            return
        view, st = self._view, self._storage
        # A zip record read whole, in order, is checked as it is read.
        whole_record = st.crc is not None and self._offset == 0 \
            and view.nbytes == len(st.data)
        if not whole_record:
            st.verify()
        step = rows or max(1, max_bytes // max(1, view[:1].nbytes))
        base = self._offset * view.itemsize
        crc = 0
        for lo in range(0, view.shape[0], step):
            part = view[lo:lo + step]
            if whole_record:
                crc = zlib.crc32(part, crc)
            yield self._widen(part)
            begin = base + lo * view.strides[0]
            st.release(begin, begin + part.nbytes)
        if whole_record:
            st.check_crc(crc)

    def _widen(self, part: np.ndarray) -> np.ndarray:
        """A copy of ``part`` (a view of the stored bytes) in native byte
        order, bfloat16 widened to float32."""
        arr = part.astype(part.dtype.newbyteorder("="), copy=True)
        if self.dtype == "bfloat16":  # the high half of a float32, exactly
            wide = np.empty(arr.shape, dtype=np.uint32)
            np.copyto(wide, arr)
            wide <<= 16
            arr = wide.view(np.float32)
        return arr

    def __repr__(self) -> str:
        return f"Tensor({self.dtype}, shape={self.shape})"

    def __setstate__(self, state) -> None:
        raise PtFileError("refusing BUILD on a tensor (tensor state would be "
                          "set by pickled code)")

    def resolve(self, where: Callable[[], str], budget: _Budget) -> None:
        """Check the tensor against its storage and make its zero-copy view;
        ``where()`` names the tensor (``tensor model/transformer.wte.weight``).

        The geometry was checked when the tensor was rebuilt (at most
        :data:`MAX_DIMS` dimensions, sizes, strides and offset in
        [0, 2**63)); here it is checked against the storage, and the bytes a
        copy would take against ``budget``, before numpy is given it.
        """
        if self._array is not None or self._view is not None:
            return
        st = self._storage
        if st is None or st.data is None:
            raise PtFileError(f"{where()}: its storage was never read "
                              f"(truncated or corrupt file?)")
        shape, stride, offset = self.shape, self._stride, self._offset
        numel = math.prod(shape)
        dt = np.dtype(st.dtype.stored)
        if st.big_endian:
            dt = dt.newbyteorder(">")
        try:
            if numel == 0:
                arr = np.empty(shape, dtype=dt.newbyteorder("="))
                if self.dtype == "bfloat16":
                    arr = arr.astype(np.float32)
                self._array = arr
                return
            need = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
            if need > st.numel:
                raise PtFileError(
                    f"{where()} of shape {shape} (storage offset "
                    f"{offset}, stride {stride}) addresses {need} "
                    f"{st.dtype.name} elements, but its storage "
                    f"{printable(st.key)} holds {st.numel}")
            if numel > st.numel:
                raise PtFileError(
                    f"{where()} of shape {shape} (stride {stride}) has "
                    f"{numel} elements, more than the {st.numel} its storage "
                    f"{printable(st.key)} holds (a broadcast view, not a weight)")
            budget.take(numel * dt.itemsize, where)
            strides = tuple(0 if n == 1 else s * dt.itemsize
                            for n, s in zip(shape, stride))
            self._view = np.ndarray(shape, dtype=dt, buffer=st.data,
                                    offset=offset * dt.itemsize, strides=strides)
        except PtFileError:
            raise
        except (ValueError, TypeError, OverflowError, MemoryError) as exc:
            raise PtFileError(f"{where()} of shape {shape}: numpy cannot "
                              f"build it: {type(exc).__name__}: "
                              f"{printable(exc, 200)}") from None


def equal(a: Tensor, b: Tensor, bitwise: bool = False) -> bool:
    """Whether ``a`` and ``b`` have one shape and the same values, read a
    block at a time: as numbers (NaN equal to nothing), or bit for bit
    (bfloat16 compared widened, which is exact; the dtypes are the caller's
    to compare)."""
    if a.shape != b.shape:
        return False
    rows = max(1, BLOCK_BYTES // (8 * max(1, math.prod(a.shape[1:]))))
    for x, y in zip(a.blocks(rows=rows), b.blocks(rows=rows)):
        same = x.tobytes() == y.tobytes() if bitwise else np.array_equal(x, y)
        if not same:
            return False
    return True


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None) -> Tensor:
    """``torch._utils._rebuild_tensor_v2``: a tensor viewing a storage."""
    if not isinstance(storage, _Storage):
        raise PtFileError(f"tensor rebuilt from {describe(storage)}, not a storage")
    where = f"tensor on storage {printable(storage.key)}"
    if not _index(storage_offset):
        raise PtFileError(f"{where}: storage offset {describe(storage_offset)} is "
                          f"not an integer in [0, 2^63)")
    problem = _dims_problem("size", size) or _dims_problem("stride", stride)
    if problem is None and len(size) != len(stride):
        problem = (f"size {_dims_text(size)} and stride {_dims_text(stride)} "
                   f"differ in length")
    if problem is not None:
        raise PtFileError(f"{where}: {problem}")
    if not isinstance(requires_grad, bool):
        raise PtFileError(f"{where}: requires_grad is {describe(requires_grad)}")
    if backward_hooks:
        raise PtFileError(f"{where} carries backward hooks")
    if metadata is not None and not isinstance(metadata, dict):
        raise PtFileError(f"{where}: metadata is {describe(metadata)}")
    return Tensor(storage.dtype.name, tuple(size), storage=storage,
                  offset=storage_offset, stride=tuple(stride))


def _rebuild_tensor(storage, storage_offset, size, stride) -> Tensor:
    """``torch._utils._rebuild_tensor`` (older PyTorch)."""
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None,
                       state=None) -> Tensor:
    """``torch._utils._rebuild_parameter[_with_state]``: the tensor itself."""
    if not isinstance(data, Tensor):
        raise PtFileError(f"parameter rebuilt from {describe(data)}, not a tensor")
    if backward_hooks:
        raise PtFileError("parameter carries backward hooks")
    if state is not None and not isinstance(state, dict):
        raise PtFileError(f"parameter state is {describe(state)}")
    return data


class _Rebuild:
    """An allow-listed function; unlike a bare function it takes no attributes."""

    __slots__ = ("name", "_fn")

    def __init__(self, name: str, fn: Callable[..., Tensor]) -> None:
        self.name, self._fn = name, fn

    def __call__(self, *args) -> Tensor:
        return self._fn(*args)

    def __setstate__(self, state) -> None:
        raise PtFileError(f"refusing BUILD on {self.name}")


class _OrderedDict(collections.OrderedDict):
    """``collections.OrderedDict`` as torch pickles a state_dict.

    ``Module.state_dict()`` returns an OrderedDict with one attribute,
    ``_metadata`` (an OrderedDict of per-module versions), so torch.save
    writes a BUILD whose state is ``{'_metadata': OrderedDict(...)}``.  That
    is accepted; any other state is refused, so that no other attribute
    (``items``, ``get``, ...) can shadow a method.
    """

    def __setstate__(self, state) -> None:
        if not isinstance(state, dict):
            what = f"state {describe(state)}"
        elif list(dict.keys(state)) != ["_metadata"]:
            names = ", ".join(_key_text(k) for k in list(dict.keys(state))[:4])
            what = f"attributes {names}" if names else "an empty state"
        elif not isinstance(dict.get(state, "_metadata"), dict):
            what = f"_metadata {describe(dict.get(state, '_metadata'))}"
        else:
            self.__dict__["_metadata"] = dict.get(state, "_metadata")
            return
        raise PtFileError(f"refusing BUILD on an OrderedDict with {what} (a torch "
                          f"state_dict sets only _metadata, a dict)")


# Messages name the class as the file does.
_OrderedDict.__name__ = _OrderedDict.__qualname__ = "OrderedDict"

_STORAGE_TYPES = {name: _StorageType(name, dtype) for name, dtype in (
    ("FloatStorage", "float32"), ("HalfStorage", "float16"),
    ("BFloat16Storage", "bfloat16"), ("DoubleStorage", "float64"),
    ("LongStorage", "int64"), ("IntStorage", "int32"),
    ("ShortStorage", "int16"), ("CharStorage", "int8"),
    ("ByteStorage", "uint8"), ("BoolStorage", "bool"),
    ("UntypedStorage", "uint8"))}

_ALLOWED: Dict[Tuple[str, str], object] = {
    **{("torch._utils", fn): _Rebuild("torch._utils." + fn, impl) for fn, impl in (
        ("_rebuild_tensor_v2", _rebuild_tensor_v2),
        ("_rebuild_tensor", _rebuild_tensor),
        ("_rebuild_parameter", _rebuild_parameter),
        ("_rebuild_parameter_with_state", _rebuild_parameter))},
    ("collections", "OrderedDict"): _OrderedDict,
    **{("torch", name): st for name, st in _STORAGE_TYPES.items()},
}


# --------------------------------------------------------------------------- #
# The restricted unpickler
# --------------------------------------------------------------------------- #
class _Unpickler(pickle.Unpickler):
    """Resolves only the allow-list; storages through ``load_storage``."""

    def __init__(self, file, what: str,
                 load_storage: Optional[Callable[[tuple], _Storage]] = None) -> None:
        super().__init__(file, encoding="utf-8")
        self._what = what
        self._load_storage = load_storage

    def find_class(self, module: str, name: str) -> object:
        # GLOBAL, STACK_GLOBAL and INST all come here (OBJ, NEWOBJ and REDUCE
        # call what they find); nothing outside the allow-list is imported.
        found = _ALLOWED.get((module, name))
        if found is None:
            raise PtFileError(f"refusing global {printable(module)}."
                              f"{printable(name)} in {self._what} ({_NOT_WEIGHTS})")
        return found

    def persistent_load(self, pid: object) -> _Storage:
        if self._load_storage is None:
            raise PtFileError(f"unexpected persistent id in {self._what}")
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise PtFileError(f"refusing persistent id {describe(pid)} in "
                              f"{self._what} ({_NOT_WEIGHTS})")
        return self._load_storage(pid)


# Opcodes by their effect on the stack, for _scan.
_PUSH_SCALAR = frozenset((
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING",
    "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "BYTEARRAY8", "NEXT_BUFFER", "NONE", "NEWTRUE", "NEWFALSE", "UNICODE",
    "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT", "BINFLOAT"))
_PUSH_EMPTY = frozenset(("EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_SET"))
_PUSH_OBJECT = frozenset(("GLOBAL", "PERSID"))  # objects with no parts
# Pop n items (or, for None, those above the topmost MARK and the MARK)
# and push one new object built from them.
_BUILD_NEW = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "REDUCE": 2, "NEWOBJ": 2,
              "NEWOBJ_EX": 3, "BINPERSID": 1, "TUPLE": None, "LIST": None,
              "DICT": None, "FROZENSET": None, "OBJ": None, "INST": None}
# Pop n items (or those above the MARK) into the object left on top.
_MODIFY = {"APPEND": 1, "SETITEM": 2, "BUILD": 1, "APPENDS": None,
           "SETITEMS": None, "ADDITEMS": None}
_NO_EFFECT = frozenset(("PROTO", "FRAME", "STOP", "READONLY_BUFFER"))
_SCALAR = [0, False]  # the shared node of every scalar: depth 0, never modified


def _scan(f: io.BytesIO, what: str) -> None:
    """Walk the next pickle's opcodes without running it; refuse what is unsafe.

    Refused: the extension-registry opcodes EXT1/2/4 (CPython resolves them
    through copyreg's process-wide cache, which can skip ``find_class``;
    torch.save never writes them); containers nested more than
    :data:`MAX_NESTING` deep; a container modified after it was put into
    another; memo PUTs that do not use the next free index and GETs of an
    index not yet put.

    The walk mirrors the unpickler's stack with one node ``[depth, nested]``
    per object: ``depth`` counts the container levels inside it (0 for a
    scalar, 1 + the deepest part for anything built from parts) and
    ``nested`` says that it has been put into another object.  Memo PUT and
    GET store and fetch nodes, so a shared object keeps its depth.  As
    modifying an object that is already nested is refused, every depth is
    final when the object is used, and the count is exact.
    """
    start = f.tell()
    stack: List[list] = []
    marks: List[int] = []
    memo: List[list] = []
    pos = start

    def fail(problem: str) -> PtFileError:
        return PtFileError(f"{what}: {problem} (opcode at byte {pos - start})")

    def take(count: Optional[int]) -> List[list]:
        fence = marks[-1] if marks else 0
        if count is None:
            if not marks:
                raise fail("an opcode that needs a MARK has none")
            del marks[-1]
        elif len(stack) - fence < count:
            raise fail("stack underflow (corrupt pickle)")
        else:
            fence = len(stack) - count
        items = stack[fence:]
        del stack[fence:]
        return items

    def nest(items: List[list]) -> int:
        """The depth of an object made of ``items``, now nested in it."""
        depth = 1
        for node in items:
            if node is not _SCALAR:
                node[1] = True
                depth = max(depth, node[0] + 1)
        if depth > MAX_NESTING:
            raise fail(f"containers nested more than {MAX_NESTING} deep "
                       f"({_NOT_WEIGHTS})")
        return depth

    try:
        for op, arg, pos in pickletools.genops(f):
            name = op.name
            if name in _PUSH_SCALAR:
                stack.append(_SCALAR)
            elif name in _PUSH_EMPTY:
                stack.append([1, False])
            elif name in _PUSH_OBJECT:
                stack.append([0, False])
            elif name == "STACK_GLOBAL":  # module and name strings: a global
                take(2)
                stack.append([0, False])
            elif name in _BUILD_NEW:
                stack.append([nest(take(_BUILD_NEW[name])), False])
            elif name in _MODIFY:
                items = take(_MODIFY[name])
                if len(stack) <= (marks[-1] if marks else 0):
                    raise fail(f"{name} without an object to modify")
                target = stack[-1]
                if target is _SCALAR:
                    continue  # the unpickler will refuse it
                if target[1]:
                    raise fail(f"{name} modifies an object already placed in "
                               f"another (a cyclic structure, {_NOT_WEIGHTS})")
                target[0] = max(target[0], nest(items))
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "POP":
                if len(stack) > (marks[-1] if marks else 0):
                    del stack[-1]
                elif marks:
                    del marks[-1]
                else:
                    raise fail("POP on an empty stack")
            elif name == "POP_MARK":
                take(None)
            elif name == "DUP":
                if len(stack) <= (marks[-1] if marks else 0):
                    raise fail("DUP on an empty stack")
                stack.append(stack[-1])
            elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                if len(stack) <= (marks[-1] if marks else 0):
                    raise fail(f"{name} on an empty stack")
                if name != "MEMOIZE" and arg != len(memo):
                    raise fail(f"{name} {describe(arg)} is not the next memo index "
                               f"{len(memo)} (picklers number them in order)")
                memo.append(stack[-1])
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if not (_index(arg) and arg < len(memo)):
                    raise fail(f"{name} {describe(arg)} of a memo index never put")
                stack.append(memo[arg])
            elif name in ("EXT1", "EXT2", "EXT4"):
                raise PtFileError(f"refusing extension-registry opcode {name} "
                                  f"(code {arg}) in {what} ({_NOT_WEIGHTS})")
            elif name not in _NO_EFFECT:
                raise fail(f"unknown opcode {name}")
    except PtFileError:
        raise
    except Exception as exc:  # genops: ValueError on bad or truncated input
        raise PtFileError(f"corrupt {what} (truncated file?): "
                          f"{printable(exc, 200)}") from None
    f.seek(start)


def _unpickle(f: io.BytesIO, what: str,
              load_storage: Optional[Callable[[tuple], _Storage]] = None) -> object:
    _scan(f, what)
    try:
        return _Unpickler(f, what, load_storage).load()
    except PtFileError:
        raise
    except Exception as exc:  # the C unpickler raises many types on bad input
        raise PtFileError(f"corrupt {what}: {type(exc).__name__}: "
                          f"{printable(exc, 200)}") from None


def _storage_pid(pid: tuple, what: str, length: int) -> Tuple[_DType, str, int]:
    """Check ``('storage', type, key, location, numel, ...)``; (dtype, key, numel)."""
    if len(pid) != length:
        raise PtFileError(f"storage id in {what} has {len(pid)} fields, "
                          f"expected {length}")
    _, stype, key, location, numel = pid[:5]
    if not isinstance(stype, _StorageType):
        raise PtFileError(f"storage id in {what} names {describe(stype)}, "
                          f"not a storage type")
    if not (isinstance(key, str) and isinstance(location, str) and _index(numel)):
        raise PtFileError(f"bad storage id in {what}: key {describe(key)}, "
                          f"location {describe(location)}, size {describe(numel)}")
    return stype.dtype, key, numel


def _path(link: Optional[tuple], limit: int = 300) -> str:
    """``tensor <path>`` from a chain of ``(parent, key, is_index)`` links;
    a path longer than ``limit`` keeps its start and end."""
    parts = []
    while link is not None:
        link, key, is_index = link
        parts.append(f"[{key}]" if is_index else _key_text(key))
    text = ""
    for part in reversed(parts):
        text += part if part.startswith("[") or not text else "/" + part
    if len(text) > limit:
        text = text[: limit // 3] + " ... " + text[-(limit - limit // 3):]
    return "tensor " + (text or "(top level)")


def _resolve_all(obj: object, budget: _Budget) -> None:
    """Build every tensor's array, in depth-first order.

    A tensor's path (``model/transformer.wte.weight``, ``list[3]``) is built
    only for a message, from links to its parents, so the walk costs the
    same whatever the depth and the length of the keys.
    """
    def children(item: object):
        if isinstance(item, dict):
            return ((k, v, False) for k, v in dict.items(item))
        return ((i, v, True) for i, v in enumerate(item))

    if isinstance(obj, Tensor):
        obj.resolve(lambda: _path(None), budget)
        return
    if not isinstance(obj, (dict, list, tuple)):
        return
    seen = {id(obj)}
    stack = [(children(obj), None)]
    while stack:
        it, link = stack[-1]
        for key, child, is_index in it:
            if isinstance(child, Tensor):
                here = (link, key, is_index)
                child.resolve(lambda: _path(here), budget)
            elif isinstance(child, (dict, list, tuple)) and id(child) not in seen:
                seen.add(id(child))
                stack.append((children(child), (link, key, is_index)))
                break
        else:
            stack.pop()


# --------------------------------------------------------------------------- #
# Formats
# --------------------------------------------------------------------------- #
def _read_member(zf: zipfile.ZipFile, name: str) -> bytes:
    """A member's bytes; its size must have been checked by the caller."""
    try:
        return zf.read(name)
    except Exception as exc:  # BadZipFile (CRC), zlib.error, EOFError, ...
        raise PtFileError(f"truncated or corrupt zip archive: member "
                          f"{printable(name)}: {printable(exc, 200)}") from None


def _small_member(zf: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """A member of at most ``limit`` bytes (checked before it is inflated)."""
    size = zf.getinfo(name).file_size
    if size > limit:
        raise PtFileError(f"zip member {printable(name)} is {size} bytes, more than "
                          f"the {limit} accepted")
    return _read_member(zf, name)


class _ViewFile(io.RawIOBase):
    """A read-only, seekable file over a memoryview of the file's mapping:
    zipfile and the unpickler read through it (in a BufferedReader), copying
    only the bytes they read."""

    def __init__(self, data: memoryview) -> None:
        super().__init__()
        self._data, self._pos = data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self._pos, len(self._data))[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buf) -> int:
        n = min(len(buf), max(0, len(self._data) - self._pos))
        memoryview(buf).cast("B")[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n


def _reader(data: memoryview) -> io.BufferedReader:
    return io.BufferedReader(_ViewFile(data))


def _record_start(data: memoryview, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes begin: after its local header (30
    bytes, the name and torch's alignment padding in the extra field)."""
    head = bytes(data[info.header_offset:info.header_offset + 30])
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise PtFileError(f"truncated or corrupt zip archive: member "
                          f"{printable(info.filename)} has no local header")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    if start + info.file_size > len(data):
        raise PtFileError(f"truncated or corrupt zip archive: member "
                          f"{printable(info.filename)} runs past the end of the file")
    return start


def _load_zip(data: memoryview, budget: _Budget, mapped: Optional[mmap.mmap]) -> object:
    try:
        zf = zipfile.ZipFile(_reader(data))
    except Exception as exc:
        raise PtFileError(f"truncated or corrupt zip archive: "
                          f"{printable(exc, 200)}") from None
    names = zf.namelist()
    if len(set(names)) != len(names):
        raise PtFileError("corrupt zip archive: a member name appears twice")
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise PtFileError(f"zip archive with {len(pickles)} <prefix>/data.pkl "
                          f"members, not a torch.save checkpoint")
    prefix = pickles[0][: -len("data.pkl")]
    if prefix + "constants.pkl" in names:
        raise PtFileError("a TorchScript archive (torch.jit.save), not a "
                          "torch.save checkpoint")
    big_endian = False
    if prefix + "byteorder" in names:
        order = _small_member(zf, prefix + "byteorder", 16).decode("ascii", "replace")
        if order not in ("little", "big"):
            raise PtFileError(f"byteorder record says {describe(order)}")
        big_endian = order == "big"
    member_names = set(names)
    storages: Dict[str, _Storage] = {}

    def load_storage(pid: tuple) -> _Storage:
        dtype, key, numel = _storage_pid(pid, "data.pkl", 5)
        old = storages.get(key)
        if old is not None:  # a storage shared by several tensors: read once
            if (old.dtype, old.numel) != (dtype, numel):
                raise PtFileError(f"storage {printable(key)} is declared as "
                                  f"{old.numel} {old.dtype.name} and as "
                                  f"{numel} {dtype.name}")
            return old
        member = prefix + "data/" + key
        if member not in member_names:
            raise PtFileError(f"storage record {printable(member)} is missing "
                              f"(truncated or corrupt archive?)")
        # Checked before a byte is read or inflated: torch.save stores
        # records uncompressed, at exactly the declared size.
        info = zf.getinfo(member)
        if info.compress_type != zipfile.ZIP_STORED:
            raise PtFileError(f"storage record {printable(member)} is compressed "
                              f"(zip method {info.compress_type}); torch.save "
                              f"stores records uncompressed")
        if info.compress_size != info.file_size:
            raise PtFileError(f"corrupt zip archive: stored record "
                              f"{printable(member)} has {info.compress_size} bytes "
                              f"in the archive for {info.file_size} of data")
        need = numel * np.dtype(dtype.stored).itemsize
        if info.file_size != need:
            raise PtFileError(f"storage {printable(key)} holds {info.file_size} "
                              f"bytes, but data.pkl declares {numel} {dtype.name} "
                              f"elements ({need} bytes)")
        st = _Storage(key, dtype, numel)
        start = _record_start(data, info)
        st.data, st.big_endian = data[start:start + info.file_size], big_endian
        st.mapped, st.start, st.crc = mapped, start, info.CRC
        storages[key] = st
        return st

    pkl = _small_member(zf, pickles[0], MAX_PICKLE_BYTES)
    obj = _unpickle(io.BytesIO(pkl), "data.pkl", load_storage)
    _resolve_all(obj, budget)
    return obj


def _is_legacy(data: memoryview) -> bool:
    """True if the first pickle in ``data`` is exactly the legacy magic number."""
    try:
        ops = []
        for op, arg, _ in pickletools.genops(io.BytesIO(bytes(data[:64]))):
            if op.name not in ("PROTO", "FRAME"):
                ops.append((op.name, arg))
            if op.name == "STOP" or len(ops) > 2:
                break
    except Exception:
        return False
    return len(ops) == 2 and ops[0][1] == LEGACY_MAGIC and ops[1][0] == "STOP"


def _load_legacy(data: memoryview, budget: _Budget, mapped: Optional[mmap.mmap]) -> object:
    f = _reader(data)  # storages are slices of data, not copies
    what = "the legacy torch.save stream"
    _unpickle(f, what)  # the magic number, checked by _is_legacy
    version = _unpickle(f, what)
    if version != LEGACY_PROTOCOL:
        raise PtFileError(f"legacy torch.save protocol version {describe(version)}, "
                          f"expected {LEGACY_PROTOCOL}")
    sys_info = _unpickle(f, what)
    if not isinstance(sys_info, dict):
        raise PtFileError(f"corrupt {what}: sys_info is not a dict")
    if dict.get(sys_info, "little_endian") is not True:
        raise PtFileError("a big-endian legacy torch.save file")
    storages: Dict[str, _Storage] = {}

    def load_storage(pid: tuple) -> _Storage:
        dtype, key, numel = _storage_pid(pid, what, 6)
        if pid[5] is not None:
            raise PtFileError(f"storage {printable(key)} is a storage view "
                              f"(PyTorch < 0.4), not supported")
        old = storages.get(key)
        if old is not None:
            if (old.dtype, old.numel) != (dtype, numel):
                raise PtFileError(f"storage {printable(key)} is declared as "
                                  f"{old.numel} {old.dtype.name} and as "
                                  f"{numel} {dtype.name}")
            return old
        storages[key] = st = _Storage(key, dtype, numel)
        return st

    obj = _unpickle(f, "the legacy main pickle", load_storage)
    keys = _unpickle(f, "the legacy storage key list")
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)
            and len(set(keys)) == len(keys)):
        raise PtFileError("corrupt legacy storage key list")
    for key in keys:
        st = storages.get(key)
        if st is None:
            raise PtFileError(f"storage {printable(key)} in the key list is not "
                              f"used by the main pickle")
        head = f.read(8)
        if len(head) != 8:
            raise PtFileError(f"truncated or corrupt file: no element count for "
                              f"storage {printable(key)}")
        count = int.from_bytes(head, "little")
        if count != st.numel:
            raise PtFileError(f"storage {printable(key)} holds {count} elements, "
                              f"but the main pickle declares {st.numel} "
                              f"{st.dtype.name} elements")
        nbytes = count * np.dtype(st.dtype.stored).itemsize
        start = f.tell()
        if start + nbytes > len(data):
            raise PtFileError(f"truncated or corrupt file: storage {printable(key)} "
                              f"needs {nbytes} bytes, {len(data) - start} remain")
        st.data, st.mapped, st.start = data[start:start + nbytes], mapped, start
        f.seek(start + nbytes)
    _resolve_all(obj, budget)
    return obj


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16",
                       "BF16": "bfloat16", "I64": "int64", "I32": "int32",
                       "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _looks_like_safetensors(data: memoryview) -> bool:
    if len(data) < 10:
        return False
    n = int.from_bytes(data[:8], "little")
    return 2 <= n and bytes(data[8:9]) == b"{"


def _no_duplicates(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise PtFileError(f"corrupt safetensors header: key "
                              f"{printable(key)} appears twice")
        out[key] = value
    return out


def _load_safetensors(data: memoryview, budget: _Budget, mapped: Optional[mmap.mmap]
                      ) -> "collections.OrderedDict[str, Tensor]":
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise PtFileError(f"truncated or corrupt safetensors file: the header "
                          f"length {n} exceeds the {len(data) - 8} bytes that follow")
    if n > MAX_SAFETENSORS_HEADER:
        raise PtFileError(f"safetensors header of {n} bytes, more than the format's "
                          f"limit of {MAX_SAFETENSORS_HEADER}")
    try:
        header = json.loads(bytes(data[8:8 + n]).decode("utf-8"),
                            object_pairs_hook=_no_duplicates)
    except PtFileError:
        raise
    except RecursionError:
        raise PtFileError("corrupt safetensors header: JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PtFileError(f"corrupt safetensors header: {printable(exc, 200)}") from None
    if not isinstance(header, dict):
        raise PtFileError("corrupt safetensors header: not a JSON object")
    meta = header.pop("__metadata__", {})
    if not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise PtFileError("corrupt safetensors header: __metadata__ is not a "
                          "string-to-string map")
    buffer = data[8 + n:]
    spans = []
    for name, entry in header.items():
        where = f"safetensors tensor {printable(name)}"
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}):
            raise PtFileError(f"{where}: header entry needs exactly dtype, shape "
                              f"and data_offsets")
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"]) \
            if isinstance(entry["dtype"], str) else None
        if dtype is None:
            raise PtFileError(f"{where}: unsupported dtype {_key_text(entry['dtype'])}")
        shape, offsets = entry["shape"], entry["data_offsets"]
        problem = _dims_problem("shape", shape)
        if problem is not None:
            raise PtFileError(f"{where}: {problem}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_index(o) for o in offsets)
                and offsets[0] <= offsets[1] <= len(buffer)):
            raise PtFileError(f"{where}: data_offsets {_dims_text(offsets)} outside "
                              f"the {len(buffer)}-byte data buffer")
        itemsize = np.dtype(_DTYPES[dtype].stored).itemsize
        need = math.prod(shape) * itemsize
        if offsets[1] - offsets[0] != need:
            raise PtFileError(f"{where}: data_offsets {offsets} span "
                              f"{offsets[1] - offsets[0]} bytes, shape {tuple(shape)} "
                              f"of {dtype} needs {need}")
        spans.append((offsets[0], offsets[1], name, dtype, tuple(shape)))
    end = 0
    for begin, stop, name, _, _ in sorted(spans, key=lambda s: s[:2]):
        if begin != end:
            raise PtFileError(f"safetensors tensor {printable(name)}: data starts at "
                              f"byte {begin}, expected {end} (overlap or hole in "
                              f"the data buffer)")
        end = stop
    if end != len(buffer):
        raise PtFileError(f"safetensors data buffer holds {len(buffer)} bytes, the "
                          f"header describes {end}")
    out: "collections.OrderedDict[str, Tensor]" = collections.OrderedDict()
    for begin, stop, name, dtype, shape in spans:
        st = _Storage(name, _DTYPES[dtype], (stop - begin) // np.dtype(
            _DTYPES[dtype].stored).itemsize)
        st.data, st.mapped, st.start = buffer[begin:stop], mapped, 8 + n + begin
        strides, acc = [], 1
        for size in reversed(shape):
            strides.append(acc)
            acc *= size
        t = Tensor(dtype, shape, storage=st, stride=tuple(reversed(strides)))
        t.resolve(lambda: f"safetensors tensor {printable(name)}", budget)
        out[name] = t
    return out


@dataclass
class Loaded:
    """What :func:`load` read: the object, the file's sha256, its format and
    its size in bytes."""

    obj: object
    sha256: str
    kind: str  # "zip", "legacy" or "safetensors"
    size: int = 0


def load(path: str) -> Loaded:
    """Map ``path`` and return its object tree with :class:`Tensor` leaves.

    The file is hashed in blocks and mapped read-only; tensors view the
    mapping and copy their values out only when asked (:meth:`Tensor.blocks`),
    so loading costs no memory of the file's size.  The hash is of the bytes
    mapped as long as the file is not rewritten while it is read.  Raises
    only :class:`PtFileError`, with a one-line message.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PtFileError(f"cannot read file: {exc.strerror or exc}") from None
    try:
        digest, size = hashlib.sha256(), 0
        while True:
            chunk = os.read(fd, BLOCK_BYTES)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else None
        if mapped is not None and len(mapped) != size:
            raise PtFileError("the file changed size while it was read")
    except OSError as exc:
        raise PtFileError(f"cannot read file: {exc.strerror or exc}") from None
    except (MemoryError, ValueError) as exc:
        raise PtFileError(f"cannot map file: {printable(exc, 200)}") from None
    finally:
        os.close(fd)
    data = memoryview(mapped) if mapped is not None else memoryview(b"")
    try:
        return _load(data, digest.hexdigest(), mapped)
    except PtFileError:
        raise
    except Exception as exc:  # MemoryError, RecursionError, a bug: still one line
        raise PtFileError(f"unexpected {type(exc).__name__} while reading: "
                          f"{printable(exc, 200)}") from None


def _load(data: memoryview, digest: str, mapped: Optional[mmap.mmap]) -> Loaded:
    if not len(data):
        raise PtFileError("empty file")
    budget = _Budget(2 * len(data) + MATERIALISE_SLACK)
    head = bytes(data[:4])
    if head in (b"PK\x03\x04", b"PK\x05\x06"):
        return Loaded(_load_zip(data, budget, mapped), digest, "zip", len(data))
    if head[:1] == b"\x80":  # pickle's PROTO opcode
        if _is_legacy(data):
            return Loaded(_load_legacy(data, budget, mapped), digest, "legacy", len(data))
        raise PtFileError("a plain pickle, not a torch.save checkpoint (zip or "
                          "legacy format) or safetensors file")
    if _looks_like_safetensors(data):
        return Loaded(_load_safetensors(data, budget, mapped), digest,
                      "safetensors", len(data))
    raise PtFileError("not a torch.save checkpoint (zip or legacy format) or "
                      "safetensors file (truncated or corrupt file?)")
