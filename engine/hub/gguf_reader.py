"""A small pure-Python reader for GGUF headers: magic, version, metadata and tensor infos.

The importer reads the header first so it can refuse a file (architecture, quantization
type, truncation) before it loads any tensor or writes anything. Tensor data is left to
`mx.load`. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import logging
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import BadRequest, CorruptModel, UnsupportedModel

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# ggml type id -> (name, elements per block, bytes per block). Sizes let us check that the
# file holds every tensor's bytes; types without a size here are only named, never read.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# GGUF metadata value types: id -> struct format (8 = string, 9 = array are special).
_SCALAR_FORMATS: dict[int, str] = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}
_STRING, _ARRAY = 8, 9
# Bounds on metadata a real file never comes near (the biggest arrays are vocabularies of
# a few hundred thousand tokens): a crafted header is refused before it costs a deep
# recursion or gigabytes of Python objects.
MAX_ARRAY_DEPTH = 8
MAX_ARRAY_ITEMS = 1 << 24  # in one array, and in all of a file's arrays together


def ggml_type_name(type_id: int) -> str:
    """"Q4_1" for 3; "type 99" for ids this reader does not know."""
    info = GGML_TYPES.get(type_id)
    return info[0] if info else f"type {type_id}"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the innermost (row length)
    ggml_type: int
    offset: int  # from the start of the data section

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major shape, as numpy/MLX see it."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def nbytes(self) -> int | None:
        """Bytes in the file, or None for a type this reader can't size."""
        info = GGML_TYPES.get(self.ggml_type)
        if info is None:
            return None
        _, block, size = info
        return self.n_elements // block * size


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int  # absolute file offset of the tensor data section
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path):
        self.buf, self.pos, self.path = buf, 0, path
        self.items = 0  # array items read so far, against MAX_ARRAY_ITEMS

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise CorruptModel(
                f"{self.path.name} is truncated or corrupt: it ends inside {what} "
                f"(offset {self.pos}, file size {len(self.buf)}). Download it again.")

    def unpack(self, fmt: str, what: str) -> tuple[Any, ...]:
        size = struct.calcsize("<" + fmt)
        self._need(size, what)
        out = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return out

    def string(self, what: str) -> str:
        (n,) = self.unpack("Q", what)
        self._need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        # Some vocabularies hold invalid UTF-8 pieces; keep them readable rather than fail.
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype], what)[0]
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise CorruptModel(f"{self.path.name} is corrupt: {what} nests arrays more "
                                   f"than {MAX_ARRAY_DEPTH} deep. Download the file again, "
                                   "or get it from another source.")
            (itype, count) = self.unpack("IQ", what)
            self.items += count
            if count > MAX_ARRAY_ITEMS or self.items > MAX_ARRAY_ITEMS:
                raise CorruptModel(f"{self.path.name} is corrupt: {what} holds an array of "
                                   f"{count} items (a file's arrays hold at most "
                                   f"{MAX_ARRAY_ITEMS} together).")
            if itype in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[itype]
                self._need(count * struct.calcsize(fmt), what)
                return list(self.unpack(f"{count}{fmt}", what))
            # Every item takes at least 8 bytes (a string length) or 12 (an array's type
            # and count); bound count before looping.
            self._need(count * (12 if itype == _ARRAY else 8 if itype == _STRING else 0),
                       what)
            return [self.value(itype, what, depth + 1) for _ in range(count)]
        raise CorruptModel(f"{self.path.name} is corrupt: unknown metadata value type "
                           f"{vtype} in {what}.")


def read_header(path: Path) -> GGUFHeader:
    """Parse the header of a GGUF file without loading tensor data.

    Raises UnsupportedModel for a file that is not GGUF (or a GGUF version this reader
    doesn't know) and CorruptModel for a truncated or damaged file; both name the file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise _not_gguf(path, f"it starts with {magic!r}, not b'GGUF'" if magic
                                else "it is empty")
            size = f.seek(0, 2)
            if size < 24:
                raise CorruptModel(f"{path.name} is truncated: {size} bytes, shorter than a "
                                   f"GGUF header. Download it again.")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, path, size)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise BadRequest(f"Can't open {path}: {e.strerror or e}. Pick a .gguf file you "
                         f"can read.", param="path") from e
    except OSError as e:  # an I/O error inside the file: a bad disk or a broken download
        raise CorruptModel(f"Could not read {path}: {e.strerror or e}.") from e


def _not_gguf(path: Path, why: str) -> UnsupportedModel:
    return UnsupportedModel(f"{path.name} is not a GGUF file ({why}). Shoal imports GGUF "
                            f"model files (.gguf) or loads MLX/Hugging Face model folders.")


def _parse(buf: mmap.mmap, path: Path, size: int) -> GGUFHeader:
    cur = _Cursor(buf, path)
    cur.pos = 4  # past the magic, checked by read_header
    (version,) = cur.unpack("I", "the version")
    if version not in (2, 3):
        raise UnsupportedModel(f"{path.name} is GGUF version {version}; Shoal reads "
                               f"versions 2 and 3.")
    n_tensors, n_kv = cur.unpack("QQ", "the header")
    if n_tensors > size or n_kv > size:  # each entry takes bytes; larger counts are garbage
        raise CorruptModel(f"{path.name} is corrupt: header claims {n_tensors} tensors and "
                           f"{n_kv} metadata entries.")

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        (vtype,) = cur.unpack("I", f"metadata {key}")
        metadata[key] = cur.value(vtype, f"metadata {key}")

    tensors: list[TensorInfo] = []
    for i in range(n_tensors):
        name = cur.string(f"tensor info #{i}")
        (n_dims,) = cur.unpack("I", f"tensor info {name}")
        if n_dims > 8:
            raise CorruptModel(f"{path.name} is corrupt: tensor {name} has {n_dims} dims.")
        dims = cur.unpack(f"{n_dims}Q", f"tensor info {name}")
        ggml_type, offset = cur.unpack("IQ", f"tensor info {name}")
        tensors.append(TensorInfo(name, tuple(dims), ggml_type, offset))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise CorruptModel(f"{path.name} is corrupt: general.alignment = {alignment!r}.")
    data_offset = -(-cur.pos // alignment) * alignment
    header = GGUFHeader(path, version, metadata, tuple(tensors), data_offset, size)
    _check_extent(header)
    log.debug("%s: GGUF v%d, %d tensors, %d metadata keys", path.name, version,
              len(tensors), len(metadata))
    return header


def _check_extent(header: GGUFHeader) -> None:
    """A download cut short passes the header but lacks tensor bytes: say so now."""
    for t in header.tensors:
        info = GGML_TYPES.get(t.ggml_type)
        if info is not None and t.dims and t.dims[0] % info[1] != 0:
            raise CorruptModel(f"{header.path.name} is corrupt: tensor {t.name} has row "
                               f"length {t.dims[0]}, not a multiple of {t.type_name}'s "
                               f"block size {info[1]}.")
        nbytes = t.nbytes
        if nbytes is None:
            continue
        end = header.data_offset + t.offset + nbytes
        if end > header.file_size:
            raise CorruptModel(
                f"{header.path.name} is truncated: tensor {t.name} needs bytes up to "
                f"{end}, the file has {header.file_size}. Download it again.")
