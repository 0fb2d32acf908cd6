"""The prefix cache's disk tier: the KV of finished prompts, kept on the node's SSD so a
long agent prompt needn't be prefilled again after the worker or the node restarts or the
model is reloaded (engine/runtime/prefix.py looks here when memory has less).

One folder per model, named by a fingerprint of its checkpoint (config.json, and each
weight file's name, size, header and first and last 64 KiB), of how the worker keeps
its KV (the bits) and, in a group, of the rank's share of the model, so a changed model
or another split never reads another's entries. Each entry is one
safetensors file written by mlx-lm's save_prompt_cache (to a temporary name, then
renamed); `index.json` lists each entry's tokens, size and last use, and is rewritten the
same way. Least recently used entries go beyond the folder's byte budget. A file that
is missing, truncated or not a cache is dropped and logged, never served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, TypedDict

log = logging.getLogger(__name__)

MIN_TOKENS = 256  # shorter prompts prefill faster than a file loads
EDGE = 64 * 1024


class DiskEntry(TypedDict):
    """One entry of index.json."""
    tokens: list[int]  # the prompt whose cache the entry's file holds
    bytes: int  # the file's size, to tell a whole file from one cut short
    used: float  # when it last served (time.time()), for least-recently-used eviction


def fingerprint(model: Path, kv_bits: int | None, share: str = "") -> str:
    """What names a model's folder of entries (see the module's docstring); `share` says
    which part of the model a group's rank holds ("": all of it)."""
    h = hashlib.sha256()
    h.update((model / "config.json").read_bytes())
    for f in sorted(model.glob("*.safetensors")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            h.update(head + fh.read(min(n, 1 << 24)) + fh.read(EDGE))
            fh.seek(max(0, size - EDGE))
            h.update(fh.read(EDGE))
    h.update(f"kv_bits={kv_bits}".encode())
    if share:
        h.update(f"share={share}".encode())
    return h.hexdigest()[:32]


def _remove(f: Path) -> None:
    with contextlib.suppress(OSError):
        f.unlink(missing_ok=True)


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _plain(cache: list[Any]) -> list[Any]:
    """mlx-lm's loader knows its own classes only: Shoal's QuantKV is saved as the
    QuantizedKVCache it extends (and made a QuantKV again on load)."""
    from mlx_lm.models.cache import QuantizedKVCache

    from engine.runtime.quant_kv import QuantKV
    return [QuantizedKVCache.from_state(c.state) if isinstance(c, QuantKV) else c
            for c in cache]


def _ours(cache: list[Any]) -> list[Any]:
    from mlx_lm.models.cache import QuantizedKVCache

    from engine.runtime.quant_kv import QuantKV
    return [QuantKV.from_state(c.state) if type(c) is QuantizedKVCache else c
            for c in cache]


class DiskCache:
    """`trimmable`: whether the model's caches can be rewound (an entry longer than what
    a prompt shares can then serve it)."""

    def __init__(self, folder: Path, budget_bytes: int, trimmable: bool = True):
        self.folder, self.budget, self.trimmable = folder, budget_bytes, trimmable
        log.info("prefix cache on disk: %s, up to %.1f GB", folder, budget_bytes / 1e9)
        self.hits = self.writes = 0
        self._warned = False
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._warn(f"can't make the prefix cache folder {folder}: {e}")
        self.index: dict[str, DiskEntry] = self._read_index()

    def _warn(self, why: str) -> None:
        if not self._warned:  # once: a full disk would say it at every request
            log.warning("prefix cache on disk: %s; going on without it", why)
            self._warned = True

    def _read_index(self) -> dict[str, DiskEntry]:
        path = self.folder / "index.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as err:
            log.warning("prefix cache on disk: %s is damaged (%s); starting it afresh",
                        path, err)
            data = {}
        for f in self.folder.glob("*.tmp.safetensors"):  # a write cut short
            _remove(f)
        index = {}
        for name, e in (data.items() if isinstance(data, dict) else ()):
            f = self.folder / f"{name}.safetensors"
            ok = isinstance(e, dict) and isinstance(e.get("tokens"), list) \
                and isinstance(e.get("used"), int | float) \
                and f.is_file() and f.stat().st_size == e.get("bytes")
            if ok:
                index[name] = e
            else:
                log.warning("prefix cache on disk: dropping %s (missing or not as written)",
                            name)
                _remove(f)
        return index

    def _write_index(self) -> None:
        tmp = self.folder / "index.json.tmp"
        tmp.write_text(json.dumps(self.index))
        os.replace(tmp, self.folder / "index.json")

    def best(self, prompt: list[int]) -> tuple[str | None, int]:
        """The entry sharing the longest prefix with `prompt` (one that is itself a prefix
        of it where the model's caches can't be trimmed), and how long that prefix is."""
        best, most = None, 0
        for name, e in self.index.items():
            n = _common(e["tokens"], prompt)
            if n > most and (self.trimmable or n == len(e["tokens"])):
                best, most = name, n
        return best, most

    def recent(self, tokens: int, entries: int) -> list[str]:
        """The most recently used entries, newest first, that fit `tokens` and `entries`
        together."""
        out: list[str] = []
        total = 0
        for name in sorted(self.index, key=lambda n: -self.index[n]["used"]):
            n = len(self.index[name]["tokens"])
            if len(out) == entries or total + n > tokens:
                break
            out.append(name)
            total += n
        return out

    def load(self, name: str) -> tuple[list[Any], list[int]] | None:
        """(the entry's cache, its tokens), or None where the file can't be read (it is
        dropped)."""
        import mlx.core as mx
        from mlx_lm.models.cache import load_prompt_cache

        e = self.index.get(name)
        if e is None:
            return None
        try:
            cache = _ours(load_prompt_cache(str(self.folder / f"{name}.safetensors")))
            mx.eval([c.state for c in cache])  # read now: a bad file fails here, and the
            # arrays belong to no thread's stream (a group reads them before it serves)
        except Exception as err:  # truncated, overwritten, not a cache: never serve it
            log.warning("prefix cache on disk: %s can't be read (%s); dropped", name, err)
            self._drop(name)
            return None
        e["used"] = time.time()
        self.hits += 1
        self._save_index()
        log.info("prefix cache: %d tokens' KV read from disk (%s)", len(e["tokens"]), name)
        return cache, list(e["tokens"])

    def put(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep a finished prompt's KV (exactly `tokens`' worth)."""
        from mlx_lm.models.cache import save_prompt_cache

        if self.budget <= 0 or len(tokens) < MIN_TOKENS:
            return
        name = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:32]
        if name in self.index:
            self.index[name]["used"] = time.time()
            self._save_index()
            return
        f = self.folder / f"{name}.safetensors"
        tmp = self.folder / f"{name}.tmp.safetensors"
        try:
            save_prompt_cache(str(tmp), _plain(cache))
            size = tmp.stat().st_size
            if size > self.budget:
                _remove(tmp)
                return
            os.replace(tmp, f)
        except (OSError, RuntimeError, ValueError) as err:  # full, unwritable, or a cache
            _remove(tmp)                                   # mlx-lm can't save
            self._warn(f"can't write {f}: {err}")
            return
        self.index[name] = {"tokens": list(tokens), "bytes": size, "used": time.time()}
        self.writes += 1
        self._evict()
        self._save_index()

    def _evict(self) -> None:
        while sum(e["bytes"] for e in self.index.values()) > self.budget and self.index:
            self._drop(min(self.index, key=lambda n: self.index[n]["used"]), save=False)

    def _drop(self, name: str, save: bool = True) -> None:
        self.index.pop(name, None)
        _remove(self.folder / f"{name}.safetensors")
        if save:
            self._save_index()

    def _save_index(self) -> None:
        try:
            self._write_index()
        except OSError as err:
            self._warn(f"can't write its index: {err}")

    def stats(self) -> dict[str, int]:
        return {"disk_entries": len(self.index), "disk_hits": self.hits,
                "disk_bytes": sum(e["bytes"] for e in self.index.values())}
