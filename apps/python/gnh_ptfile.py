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
other global is refused with its name before anything is called, and the
extension-registry opcodes (EXT1/2/4), whose look-up can bypass
``find_class``, are refused by a scan before unpickling.  Tensors come back
as :class:`Tensor`: the source dtype and a numpy array of the values
(bfloat16 widened exactly to float32).
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import pickle
import pickletools
import zipfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["PtFileError", "Tensor", "Loaded", "load", "LEGACY_MAGIC"]

#: First object of the legacy (non-zip) ``torch.save`` stream.
LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
LEGACY_PROTOCOL = 1001
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


def _printable(text: object, limit: int = 80) -> str:
    """A name from the file, safe to put in a one-line message."""
    text = str(text)
    if not text.isprintable() or len(text) > limit:
        text = repr(text[:limit])
    return text


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
    """One storage record: ``numel`` elements of ``dtype``, bytes set once read."""

    __slots__ = ("key", "dtype", "numel", "data", "big_endian")

    def __init__(self, key: str, dtype: _DType, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel
        self.data: Optional[memoryview] = None
        self.big_endian = False

    def __setstate__(self, state) -> None:
        raise PtFileError(f"refusing BUILD on storage {_printable(self.key)}")

    def elements(self) -> np.ndarray:
        """The stored elements, read-only, in stored byte order."""
        dt = np.dtype(self.dtype.stored)
        if self.big_endian:
            dt = dt.newbyteorder(">")
        arr = np.frombuffer(self.data, dtype=dt, count=self.numel)
        arr.flags.writeable = False
        return arr


class Tensor:
    """A tensor read from a file.

    ``dtype`` is the source dtype's PyTorch name; ``array`` holds the values
    in native byte order (float16/32/64, integers, bool; bfloat16 widened
    exactly to float32).  Tensors from pickles are resolved after every
    storage is read; until then ``array`` raises.
    """

    __slots__ = ("dtype", "shape", "_array", "_storage", "_offset", "_stride")

    def __init__(self, dtype: str, shape: Tuple[int, ...],
                 array: Optional[np.ndarray] = None,
                 storage: Optional[_Storage] = None, offset: int = 0,
                 stride: Tuple[int, ...] = ()) -> None:
        self.dtype, self.shape = dtype, shape
        self._array, self._storage = array, storage
        self._offset, self._stride = offset, stride

    @property
    def is_floating(self) -> bool:
        return _DTYPES[self.dtype].floating

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            raise PtFileError("tensor used before its storage was read")
        return self._array

    def __repr__(self) -> str:
        return f"Tensor({self.dtype}, shape={self.shape})"

    def __setstate__(self, state) -> None:
        raise PtFileError("refusing BUILD on a tensor (tensor state would be "
                          "set by pickled code)")

    def resolve(self, where: str) -> None:
        """Build ``array`` from the storage; ``where`` names the tensor."""
        if self._array is not None:
            return
        st = self._storage
        if st is None or st.data is None:
            raise PtFileError(f"tensor {where}: its storage was never read "
                              f"(truncated or corrupt file?)")
        shape, stride = self.shape, self._stride
        if 0 in shape:
            arr = np.empty(shape, dtype=np.dtype(st.dtype.stored))
        else:
            need = self._offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
            if need > st.numel:
                raise PtFileError(
                    f"tensor {where} of shape {shape} (storage offset "
                    f"{self._offset}, stride {stride}) addresses {need} "
                    f"{st.dtype.name} elements, but its storage "
                    f"{_printable(st.key)} holds {st.numel}")
            base = st.elements()[self._offset:]
            strides = tuple(0 if n == 1 else s * base.itemsize
                            for n, s in zip(shape, stride))
            view = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides,
                                                   writeable=False)
            arr = view.astype(base.dtype.newbyteorder("="), copy=True)
        if self.dtype == "bfloat16":  # the high half of a float32, exactly
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        self._array = arr
        self._storage = None


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dims(value: object) -> bool:
    return isinstance(value, (tuple, list)) and all(_int(v) and v >= 0 for v in value)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None) -> Tensor:
    """``torch._utils._rebuild_tensor_v2``: a tensor viewing a storage."""
    if not isinstance(storage, _Storage):
        raise PtFileError(f"tensor rebuilt from a {type(storage).__name__}, "
                          f"not a storage")
    if not (_int(storage_offset) and storage_offset >= 0 and _dims(size)
            and _dims(stride) and len(size) == len(stride)):
        geometry = _printable(repr((storage_offset, size, stride)), 120)
        raise PtFileError(f"tensor on storage {_printable(storage.key)} has a bad "
                          f"(offset, size, stride): {geometry}")
    if not isinstance(requires_grad, bool):
        raise PtFileError(f"tensor on storage {_printable(storage.key)}: "
                          f"requires_grad is a {type(requires_grad).__name__}")
    if backward_hooks:
        raise PtFileError(f"tensor on storage {_printable(storage.key)} carries "
                          f"backward hooks")
    if metadata is not None and not isinstance(metadata, dict):
        raise PtFileError(f"tensor on storage {_printable(storage.key)}: metadata "
                          f"is a {type(metadata).__name__}")
    return Tensor(storage.dtype.name, tuple(size), storage=storage,
                  offset=storage_offset, stride=tuple(stride))


def _rebuild_tensor(storage, storage_offset, size, stride) -> Tensor:
    """``torch._utils._rebuild_tensor`` (older PyTorch)."""
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None,
                       state=None) -> Tensor:
    """``torch._utils._rebuild_parameter[_with_state]``: the tensor itself."""
    if not isinstance(data, Tensor):
        raise PtFileError(f"parameter rebuilt from a {type(data).__name__}, "
                          f"not a tensor")
    if backward_hooks:
        raise PtFileError("parameter carries backward hooks")
    if state is not None and not isinstance(state, dict):
        raise PtFileError(f"parameter state is a {type(state).__name__}")
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
    ("collections", "OrderedDict"): collections.OrderedDict,
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
            raise PtFileError(f"refusing global {_printable(module)}."
                              f"{_printable(name)} in {self._what} ({_NOT_WEIGHTS})")
        return found

    def persistent_load(self, pid: object) -> _Storage:
        if self._load_storage is None:
            raise PtFileError(f"unexpected persistent id in {self._what}")
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise PtFileError(f"refusing persistent id {_printable(repr(pid))} in "
                              f"{self._what} ({_NOT_WEIGHTS})")
        return self._load_storage(pid)


def _scan(f: io.BytesIO, what: str) -> None:
    """Walk the next pickle's opcodes without running it; refuse EXT1/2/4.

    CPython resolves extension codes through copyreg's process-wide cache,
    which can skip ``find_class``.  ``torch.save`` never writes them.
    """
    start = f.tell()
    try:
        for op, arg, _ in pickletools.genops(f):
            if op.name in ("EXT1", "EXT2", "EXT4"):
                raise PtFileError(f"refusing extension-registry opcode {op.name} "
                                  f"(code {arg}) in {what} ({_NOT_WEIGHTS})")
    except PtFileError:
        raise
    except Exception as exc:
        raise PtFileError(f"corrupt {what} (truncated file?): "
                          f"{_printable(exc, 200)}") from None
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
                          f"{_printable(exc, 200)}") from None


def _storage_pid(pid: tuple, what: str, length: int) -> Tuple[_DType, str, int]:
    """Check ``('storage', type, key, location, numel, ...)``; (dtype, key, numel)."""
    if len(pid) != length:
        raise PtFileError(f"storage id in {what} has {len(pid)} fields, "
                          f"expected {length}")
    _, stype, key, location, numel = pid[:5]
    if not isinstance(stype, _StorageType):
        raise PtFileError(f"storage id in {what} names a {type(stype).__name__}, "
                          f"not a storage type")
    if not (isinstance(key, str) and isinstance(location, str)
            and _int(numel) and numel >= 0):
        raise PtFileError(f"bad storage id in {what}: {_printable(repr(pid))}")
    return stype.dtype, key, numel


def _resolve_all(obj: object) -> None:
    """Build every tensor's array, naming the first bad one by its path."""
    seen = set()
    stack: List[Tuple[object, str]] = [(obj, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, Tensor):
            item.resolve(path or "(top level)")
            continue
        if id(item) in seen:
            continue
        if isinstance(item, dict):
            seen.add(id(item))
            children = [(v, f"{path}/{_printable(k)}" if path else _printable(k))
                        for k, v in item.items()]
        elif isinstance(item, (list, tuple)):
            seen.add(id(item))
            children = [(v, f"{path}[{i}]") for i, v in enumerate(item)]
        else:
            continue
        stack.extend(reversed(children))


# --------------------------------------------------------------------------- #
# Formats
# --------------------------------------------------------------------------- #
def _read_member(zf: zipfile.ZipFile, name: str) -> bytes:
    try:
        return zf.read(name)
    except Exception as exc:  # BadZipFile (CRC), zlib.error, EOFError, ...
        raise PtFileError(f"truncated or corrupt zip archive: member "
                          f"{_printable(name)}: {_printable(exc, 200)}") from None


def _load_zip(raw: bytes) -> object:
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw))  # shares raw's buffer, no copy
    except Exception as exc:
        raise PtFileError(f"truncated or corrupt zip archive: "
                          f"{_printable(exc, 200)}") from None
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
        order = _read_member(zf, prefix + "byteorder").decode("ascii", "replace")
        if order not in ("little", "big"):
            raise PtFileError(f"byteorder record says {_printable(order)!r}")
        big_endian = order == "big"
    member_names = set(names)
    storages: Dict[str, _Storage] = {}

    def load_storage(pid: tuple) -> _Storage:
        dtype, key, numel = _storage_pid(pid, "data.pkl", 5)
        old = storages.get(key)
        if old is not None:  # a storage shared by several tensors: read once
            if (old.dtype, old.numel) != (dtype, numel):
                raise PtFileError(f"storage {_printable(key)} is declared as "
                                  f"{old.numel} {old.dtype.name} and as "
                                  f"{numel} {dtype.name}")
            return old
        member = prefix + "data/" + key
        if member not in member_names:
            raise PtFileError(f"storage record {_printable(member)} is missing "
                              f"(truncated or corrupt archive?)")
        raw = _read_member(zf, member)
        need = numel * np.dtype(dtype.stored).itemsize
        if len(raw) != need:
            raise PtFileError(f"storage {_printable(key)} holds {len(raw)} bytes, "
                              f"but data.pkl declares {numel} {dtype.name} "
                              f"elements ({need} bytes)")
        st = _Storage(key, dtype, numel)
        st.data, st.big_endian = memoryview(raw), big_endian
        storages[key] = st
        return st

    pkl = _read_member(zf, pickles[0])
    obj = _unpickle(io.BytesIO(pkl), "data.pkl", load_storage)
    _resolve_all(obj)
    return obj


def _is_legacy(raw: bytes) -> bool:
    """True if the first pickle in ``raw`` is exactly the legacy magic number."""
    try:
        ops = []
        for op, arg, _ in pickletools.genops(io.BytesIO(raw[:64])):
            if op.name not in ("PROTO", "FRAME"):
                ops.append((op.name, arg))
            if op.name == "STOP" or len(ops) > 2:
                break
    except Exception:
        return False
    return len(ops) == 2 and ops[0][1] == LEGACY_MAGIC and ops[1][0] == "STOP"


def _load_legacy(raw: bytes) -> object:
    data = memoryview(raw)  # storages are slices of it, not copies
    f = io.BytesIO(raw)
    what = "the legacy torch.save stream"
    _unpickle(f, what)  # the magic number, checked by _is_legacy
    version = _unpickle(f, what)
    if version != LEGACY_PROTOCOL:
        raise PtFileError(f"legacy torch.save protocol version {_printable(version)}, "
                          f"expected {LEGACY_PROTOCOL}")
    sys_info = _unpickle(f, what)
    if not isinstance(sys_info, dict):
        raise PtFileError(f"corrupt {what}: sys_info is not a dict")
    if sys_info.get("little_endian") is not True:
        raise PtFileError("a big-endian legacy torch.save file")
    storages: Dict[str, _Storage] = {}

    def load_storage(pid: tuple) -> _Storage:
        dtype, key, numel = _storage_pid(pid, what, 6)
        if pid[5] is not None:
            raise PtFileError(f"storage {_printable(key)} is a storage view "
                              f"(PyTorch < 0.4), not supported")
        old = storages.get(key)
        if old is not None:
            if (old.dtype, old.numel) != (dtype, numel):
                raise PtFileError(f"storage {_printable(key)} is declared as "
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
            raise PtFileError(f"storage {_printable(key)} in the key list is not "
                              f"used by the main pickle")
        head = f.read(8)
        if len(head) != 8:
            raise PtFileError(f"truncated or corrupt file: no element count for "
                              f"storage {_printable(key)}")
        count = int.from_bytes(head, "little")
        if count != st.numel:
            raise PtFileError(f"storage {_printable(key)} holds {count} elements, "
                              f"but the main pickle declares {st.numel} "
                              f"{st.dtype.name} elements")
        nbytes = count * np.dtype(st.dtype.stored).itemsize
        start = f.tell()
        if start + nbytes > len(data):
            raise PtFileError(f"truncated or corrupt file: storage {_printable(key)} "
                              f"needs {nbytes} bytes, {len(data) - start} remain")
        st.data = data[start:start + nbytes]
        f.seek(start + nbytes)
    _resolve_all(obj)
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
                              f"{_printable(key)} appears twice")
        out[key] = value
    return out


def _load_safetensors(data: memoryview) -> "collections.OrderedDict[str, Tensor]":
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise PtFileError(f"truncated or corrupt safetensors file: the header "
                          f"length {n} exceeds the {len(data) - 8} bytes that follow")
    try:
        header = json.loads(bytes(data[8:8 + n]).decode("utf-8"),
                            object_pairs_hook=_no_duplicates)
    except PtFileError:
        raise
    except (UnicodeDecodeError, ValueError) as exc:
        raise PtFileError(f"corrupt safetensors header: {_printable(exc, 200)}") from None
    if not isinstance(header, dict):
        raise PtFileError("corrupt safetensors header: not a JSON object")
    meta = header.pop("__metadata__", {})
    if not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise PtFileError("corrupt safetensors header: __metadata__ is not a "
                          "string-to-string map")
    buffer = data[8 + n:]
    spans = []
    for name, entry in header.items():
        where = f"safetensors tensor {_printable(name)}"
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}):
            raise PtFileError(f"{where}: header entry needs exactly dtype, shape "
                              f"and data_offsets")
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"]) \
            if isinstance(entry["dtype"], str) else None
        if dtype is None:
            raise PtFileError(f"{where}: unsupported dtype {_printable(entry['dtype'])}")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not _dims(shape):
            raise PtFileError(f"{where}: bad shape {_printable(shape)}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and _dims(offsets)
                and offsets[0] <= offsets[1] <= len(buffer)):
            raise PtFileError(f"{where}: data_offsets {_printable(offsets)} outside "
                              f"the {len(buffer)}-byte data buffer")
        itemsize = np.dtype(_DTYPES[dtype].stored).itemsize
        need = int(np.prod(shape, dtype=object)) * itemsize
        if offsets[1] - offsets[0] != need:
            raise PtFileError(f"{where}: data_offsets {offsets} span "
                              f"{offsets[1] - offsets[0]} bytes, shape {tuple(shape)} "
                              f"of {dtype} needs {need}")
        spans.append((offsets[0], offsets[1], name, dtype, tuple(shape)))
    end = 0
    for begin, stop, name, _, _ in sorted(spans):
        if begin != end:
            raise PtFileError(f"safetensors tensor {_printable(name)}: data starts at "
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
        st.data = buffer[begin:stop]
        strides, acc = [], 1
        for size in reversed(shape):
            strides.append(acc)
            acc *= size
        t = Tensor(dtype, shape, storage=st, stride=tuple(reversed(strides)))
        t.resolve(f"safetensors tensor {_printable(name)}")
        out[name] = t
    return out


@dataclass
class Loaded:
    """What :func:`load` read: the object, the file's sha256 and its format."""

    obj: object
    sha256: str
    kind: str  # "zip", "legacy" or "safetensors"


def load(path: str) -> Loaded:
    """Read ``path`` once; return its object tree with :class:`Tensor` leaves."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise PtFileError(f"cannot read file: {exc.strerror or exc}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if not raw:
        raise PtFileError("empty file")
    if raw[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return Loaded(_load_zip(raw), digest, "zip")
    if raw[:1] == b"\x80":  # pickle's PROTO opcode
        if _is_legacy(raw):
            return Loaded(_load_legacy(raw), digest, "legacy")
        raise PtFileError("a plain pickle, not a torch.save checkpoint (zip or "
                          "legacy format) or safetensors file")
    if _looks_like_safetensors(memoryview(raw)):
        return Loaded(_load_safetensors(memoryview(raw)), digest, "safetensors")
    raise PtFileError("not a torch.save checkpoint (zip or legacy format) or "
                      "safetensors file (truncated or corrupt file?)")
