"""The prefix cache's disk tier in a group. Each rank keeps its own layers' KV (or its
heads' share of it) of finished prompts on its own node's disk, in a folder named by the
checkpoint, the KV bits and the rank's share (engine/runtime/disk_cache.py).

A lookup must find the same on every rank (engine/runtime/prefix.py), and disks on
different nodes can't promise that: one may be full, another's file damaged. So the
ranks read their disks once, as the group forms: rank 0 names its most recent entries
that fit the prefix cache's budget, every rank loads those it can (within a time
bound), an all_sum counts who holds each, and only entries every rank holds go into
the prefix tries, oldest first, on every rank alike. While the group serves, lookups
read memory only and every rank writes its finished prompts to its disk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WORDS = 4  # an entry's name (32 hex digits) as int32s


def share(cfg: Any) -> str:
    """The part of the model a rank holds, for its folder's name."""
    held = f" layers {list(cfg.layers[cfg.rank])}" if cfg.strategy == "pipeline" else ""
    return f"{cfg.strategy} rank {cfg.rank} of {cfg.world}{held}"


def open_disk(root: Path | None, budget: int, model: Path, cfg: Any) -> Any:
    """This rank's DiskCache (None: none asked for, or the model's files can't be read)."""
    if root is None or budget <= 0:
        return None
    from engine.runtime.disk_cache import DiskCache, fingerprint
    try:
        folder = root / fingerprint(model, cfg.kv_bits, share(cfg))
    except OSError as e:
        log.warning("no prefix cache on disk: can't read the model's files (%s)", e)
        return None
    return DiskCache(folder, budget)


def _words(name: str) -> list[int]:
    raw = bytes.fromhex(name)
    return [int.from_bytes(raw[i:i + 4], "little", signed=True) for i in range(0, 16, 4)]


def _name(words: list[int]) -> str:
    return b"".join(int(w).to_bytes(4, "little", signed=True) for w in words).hex()


def restore(prefix: Any, disk: Any, all_sum: Callable[[Any], Any], rank: int, world: int,
            within_s: float, max_entries: int = 16) -> int:
    """Every rank of the group, together: fill the prefix tries with the entries every
    rank's disk holds (see the module's docstring). `all_sum` is the group's collective
    (each call bounded by the watchdog); loading stops after `within_s`, so no rank keeps
    the others waiting past it. Returns the entries restored."""
    import mlx.core as mx

    names = disk.recent(prefix.budget_tokens, max_entries) \
        if rank == 0 and disk is not None and prefix.budget_tokens > 0 else []
    n = int(all_sum(mx.array([len(names)], mx.int32)).item())
    if n == 0:
        return 0
    mine = [w for name in names for w in _words(name)] if rank == 0 else [0] * (n * WORDS)
    flat = [int(x) for x in all_sum(mx.array(mine, mx.int32)).tolist()]
    names = [_name(flat[i:i + WORDS]) for i in range(0, len(flat), WORDS)]
    deadline = time.monotonic() + within_s
    loaded: list[tuple[list[Any], list[int]] | None] = []
    for name in names:
        got = disk.load(name) if disk is not None and time.monotonic() < deadline else None
        loaded.append(got)
    held = all_sum(mx.array([got is not None for got in loaded], mx.int32)).tolist()
    restored = 0
    for got, count in reversed(list(zip(loaded, held, strict=True))):  # oldest first
        if got is not None and int(count) == world:
            prefix.put(got[1], got[0])
            restored += 1
    if restored < n:
        log.info("prefix cache: %d of %d entries on disk are held by every rank; only "
                 "those are used", restored, n)
    log.info("prefix cache: %d entries (%d tokens) restored from disk", restored,
             prefix.tokens())
    return restored
