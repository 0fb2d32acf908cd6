"""The hand-over's wire form (engine/runtime/handover.py writes and reads it; the nodes
pass it on, engine/node/handover.py): a stream of frames, each a 4-byte big-endian header
length, a JSON header, and the raw bytes of the arrays the header lists, in order.

"begin" says whose KV follows (the checkpoint's fingerprint, the tokens, each layer's
cache kind); "rows" carries the rows one layer gained from one prefill chunk, sent as the
layer produced them; "state" a windowed or recurrent layer's whole state once final;
"end" (or "error") is the prefill node's last word. Pure Python: a node reads the frames'
bounds without MLX."""

from __future__ import annotations

import json
import struct
from typing import Any

DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint32": 4}
HEADER_MAX = 8 << 20  # a begin frame's token ids (about a million) at most
ARRAYS_MAX = 16  # a layer's arrays in one frame: quantized K and V are 6


class FrameError(ValueError):
    """Bytes that aren't hand-over frames."""


def encode(header: dict[str, Any]) -> bytes:
    """A frame's length and header; its arrays' bytes follow it."""
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack(">I", len(h)) + h


def payload_size(header: dict[str, Any]) -> int:
    """The bytes of the arrays `header` lists (a FrameError where the list isn't one)."""
    arrays = header.get("arrays", [])
    if not isinstance(arrays, list) or len(arrays) > ARRAYS_MAX:
        raise FrameError("a frame lists too many arrays")
    total = 0
    for a in arrays:
        if not (isinstance(a, list) and len(a) == 2 and a[0] in DTYPES
                and isinstance(a[1], list) and 0 < len(a[1]) <= 6
                and all(type(d) is int and 0 <= d < 1 << 31 for d in a[1])):
            raise FrameError(f"a frame lists an array as {str(a)[:80]}")
        n = DTYPES[a[0]]
        for d in a[1]:
            n *= d
        total += n
    return total


class Reader:
    """Whole frames out of bytes as they arrive. `keep` False: headers only (a node
    passing the stream on needs the frames' bounds, not the arrays)."""

    def __init__(self, keep: bool = True):
        self.keep = keep
        self._buf = bytearray()
        self._header: dict[str, Any] | None = None
        self._left = 0  # the current frame's payload bytes still to come

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self._buf += data
        frames = []
        while True:
            if self._header is None:
                if len(self._buf) < 4:
                    break
                (n,) = struct.unpack(">I", self._buf[:4])
                if n > HEADER_MAX:
                    raise FrameError(f"a frame header of {n} bytes")
                if len(self._buf) < 4 + n:
                    break
                try:
                    header = json.loads(bytes(self._buf[4:4 + n]))
                except ValueError:
                    raise FrameError("a frame header that isn't JSON") from None
                if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
                    raise FrameError("a frame header without its kind")
                self._left = payload_size(header)
                self._header = header
                del self._buf[:4 + n]
            if self.keep:
                if self._left > len(self._buf):
                    break
                payload = bytes(self._buf[:self._left])
                del self._buf[:self._left]
            else:
                skip = min(self._left, len(self._buf))
                del self._buf[:skip]
                self._left -= skip
                if self._left:
                    break
                payload = b""
            frames.append((self._header, payload))
            self._header, self._left = None, 0
        return frames

    @property
    def pending(self) -> bool:
        """Whether a frame is cut off (bytes of one that hasn't all come)."""
        return self._header is not None or bool(self._buf)
