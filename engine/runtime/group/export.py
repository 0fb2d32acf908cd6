"""A pipeline group prefilling for another node (engine/node/handover_group.py GroupPrefill).
Rank 0 admits the prompt like any other, marked in its plan as an export: on every rank
the prompt's own cache writes the rows of the layers that rank holds to its node's
hand-over folder as each chunk makes them (engine/runtime/handover.py's frames; rank 0
writes the "begin" frame), windowed or recurrent layers whole once the last chunk has
passed, then a "rank_end" frame. The prompt never decodes and never enters the prefix
cache: once its chunks are done it leaves every rank at the same step (state.joined)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

RANK_END = "rank_end"


def export_name(job: Any) -> str:
    """A rank's frames for export `job` in its node's hand-over folder."""
    from engine.runtime.group.adopt import job_file
    return job_file(job, "p")


def refusal(cache: list[Any]) -> str | None:
    """Why a model whose caches are `cache` can't be exported, or None."""
    from engine.runtime.handover import ROWS, WHOLE
    odd = sorted({type(c).__name__ for c in cache} - set(ROWS + WHOLE))
    return f"This model keeps {odd[0]} layers, which can't be handed to another node." \
        if odd else None


class Exporter:
    """One rank's writer for one export: hooks the prompt's cache (this rank's layers)."""

    def __init__(self, path: Path, layers: tuple[int, int], first: bool, made_by: str,
                 tokens: list[int], cache: list[Any]):
        from engine.runtime.handover import ROWS, _send_rows
        from engine.runtime.kv_frames import encode

        self.layers = layers
        self.kinds = [type(c).__name__ for c in cache]
        self.out = path.open("wb", buffering=0)  # each frame seen as soon as written
        if first:
            self.out.write(encode({"kind": "begin", "made_by": made_by, "tokens": tokens,
                                   "layers": self.kinds}))
        never = threading.Event()  # (a cancelled export leaves at its plan instead)
        for i in range(*layers):
            if self.kinds[i] in ROWS:
                _send_rows(cache[i], i, self.out, never)

    def finish(self, cache: list[Any]) -> None:
        """The prompt's last chunk has passed: this rank's whole layers, then its end."""
        from engine.runtime.handover import WHOLE, _layer_arrays, _whole, _write
        from engine.runtime.kv_frames import encode

        for i in range(*self.layers):
            if self.kinds[i] in WHOLE:
                _write(self.out, {"kind": "state", "layer": i, **_whole(cache[i])},
                       _layer_arrays(cache[i]))
        self.out.write(encode({"kind": RANK_END}))
        self.out.close()

    def abort(self) -> None:
        from engine.runtime.kv_frames import encode
        with contextlib.suppress(OSError, ValueError):
            self.out.write(encode({"kind": "error", "message": "the prefill was cancelled"}))
            self.out.close()
