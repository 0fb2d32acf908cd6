"""The node's state and its one local worker: which model is loaded, loading, switching,
and the status stream the GUI reads."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine import __version__, protocol
from engine.errors import ModelNotFound, ShoalError, WorkerFailed
from engine.node.beside import Beside
from engine.node.state import status_record
from engine.node.worker_handle import WorkerHandle
from engine.paths import logs_dir
from engine.records import (
    ClusterInfo,
    RunnerFailed,
    RunnerIdle,
    RunnerLoading,
    RunnerPreparing,
    RunnerReady,
    RunnerState,
    StatusInfo,
    StreamsInfo,
)

log = logging.getLogger(__name__)


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


class Node:
    def __init__(self, home: Path, models_dir: Path, default_model: str | None = None,
                 token_timeout: float = 300.0, port: int = 0, max_streams: int = 16,
                 queue_wait_s: float = 60.0, worker_args: tuple[str, ...] = (),
                 kv_bits: int | None = None, keep_alive_s: float | None = None,
                 prefix_disk_bytes: int = 0, memory_limit: int | None = None):
        self.home = home
        # a model unused this long is unloaded (None: never); a request may set its own
        self.keep_alive_s = keep_alive_s
        self.keep_alive: dict[str, float | None] = {}  # model -> what its last request set
        # the node that prefills this node's long prompts (engine/node/handover.py)
        self.prefill: Any = None
        from engine.node.model_settings import ModelSettings
        self.model_settings = ModelSettings(home)  # e.g. a context limit per model
        self._used = time.monotonic()  # when the last request ended
        self.worker_args = worker_args  # extra flags for its workers (drafting)
        self.kv_bits = kv_bits  # quantized KV for launches that don't choose (8, 4)
        # what happens next when a distributed instance fails (engine/node/healing.py):
        # told to the requests that fail with it, and to those that come after
        self.heal_hint: Callable[[str], str | None] = lambda model: None
        self.heal_note: Callable[[str], str | None] = lambda model: None
        self.prefix_disk_bytes = prefix_disk_bytes  # per model (0: no disk tier)
        self.memory_limit = memory_limit  # admission's budget in bytes (None: the machine's)
        self.max_streams, self.queue_wait_s = max_streams, queue_wait_s
        self.port = port
        self.models_dir = models_dir
        self.default_model = default_model
        self.token_timeout = token_timeout
        self.runner: RunnerState = RunnerIdle()
        self.worker: WorkerHandle | None = None
        self._load_lock = asyncio.Lock()
        self._subscribers: set[asyncio.Queue[StatusInfo]] = set()
        self._tasks: set[asyncio.Task] = set()
        self._checked: dict[tuple[str, bool], tuple[tuple[float, ...], Any]] = {}
        self._preparing: asyncio.Task | None = None
        from engine.node.metrics import NodeMetrics
        # the figures of the requests served here: /metrics and the app's charts
        self.metrics = NodeMetrics()
        self.metrics.live = self._live
        # embedding and reranker models, each in its own worker beside the main one
        self.beside = Beside(self, self._publish)

    # --- status ----------------------------------------------------------------------
    def status(self, cluster: ClusterInfo | None = None) -> StatusInfo:
        """The /shoal/status body."""
        return status_record(
            self.runner, __version__,
            worker_pid=self.worker.pid if self.worker and self.worker.alive else None,
            models_dir=str(self.models_dir), default_model=self.default_model,
            streams=self._streams(), cluster=cluster, beside=self.beside.runners())

    def generating(self) -> bool:
        """Whether this node's worker has requests in flight (safe from any thread)."""
        w = self.worker
        return bool(w is not None and w.alive and w.in_flight)

    def _live(self) -> tuple[str, int, int] | None:
        """(model, running, waiting) of the worker, for /metrics: what _streams says."""
        w = self.worker
        return (w.model_id, w.in_flight, w.waiting) if w is not None and w.alive else None

    def _streams(self) -> StreamsInfo:
        """Requests in flight and waiting, for the charts."""
        w = self.worker
        if w is None or not w.alive:
            return StreamsInfo(0, 0, self.max_streams)
        return StreamsInfo(w.in_flight, w.waiting, self.max_streams)

    def subscribe(self) -> asyncio.Queue[StatusInfo]:
        q: asyncio.Queue = asyncio.Queue(maxsize=100)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[StatusInfo]) -> None:
        self._subscribers.discard(q)

    def _set(self, state: RunnerState) -> None:
        if state == self.runner:
            return
        self.runner = state
        self._publish()

    def _publish(self) -> None:
        """Send the status to every subscriber (the GUI's event stream)."""
        snapshot = self.status()
        for q in list(self._subscribers):
            if q.full():  # a stalled reader only ever needs the latest snapshot
                q.get_nowait()
            q.put_nowait(snapshot)

    # --- models ----------------------------------------------------------------------
    def local_models(self) -> list[Any]:
        """The models here, each with the context it runs with (the user's limit)."""
        from dataclasses import replace

        from engine.hub.local import list_local_models
        return [replace(m, context_length=self.model_settings.capped(m.id, m.context_length))
                if m.context_length else m for m in list_local_models(self.models_dir)]

    def resolve(self, model_id: str) -> Path:
        """The folder of the model `model_id` on this node. BadRequest (param "model")
        for an id no model can have (too long, control characters, a path), checked
        before it touches the disk; ModelNotFound with the models here otherwise."""
        from engine.errors import BadRequest
        from engine.hub.local import find_local_model, why_unusable
        from engine.hub.names import model_id_problem, shown
        why = model_id_problem(model_id)
        if why:
            raise BadRequest(f"'model' is not a model name ({shown(model_id, 40)}): {why}. "
                             "GET /v1/models lists the models here.", param="model")
        found = find_local_model(self.models_dir, model_id)
        folder = self.models_dir / model_id
        if found is None and "/" not in model_id and not model_id.startswith(".") \
                and folder.is_dir() and (why := why_unusable(folder)):
            from engine.errors import CorruptModel
            raise CorruptModel(f"The model '{model_id}' can't be used: {why}. Download or "
                               "import it again.", param="model")
        if found is None:
            names = ", ".join(m.id for m in self.local_models()) or "none"
            raise ModelNotFound(f"The model '{model_id}' is not on this node. Models here: "
                                f"{names}. Import or download it first (shoal models).",
                                param="model")
        return Path(found.path)

    async def check_model(self, path: Path, all_files: bool = True) -> Any:
        """engine.hub.checkpoint.inspect off the event loop, remembered while the
        folder's config and index are unchanged: a refusal names the field or file."""
        from engine.hub.checkpoint import inspect

        stamp = tuple(_mtime(path / n) for n in ("config.json", "model.safetensors.index.json",
                                                  "tokenizer_config.json"))
        key = (str(path), all_files)
        hit = self._checked.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        found = await asyncio.to_thread(inspect, path, True, all_files)
        self._checked[key] = (stamp, found)
        return found

    # --- the worker ------------------------------------------------------------------
    async def prepared(self, timeout: float = 900) -> None:
        """Once the first run's default model is imported (at once when it is not)."""
        if self._preparing is not None and not self._preparing.done():
            await asyncio.wait_for(asyncio.shield(self._preparing), timeout)

    async def ensure_loaded(self, model_id: str | None = None) -> WorkerHandle:
        """The running worker for model_id (or the current/default model), starting or
        switching the worker as needed. A failed distributed instance is not silently
        replaced by a single-process one: it must be launched again."""
        await self.prepared()  # e.g. importing the default model
        async with self._load_lock:
            model_id = model_id or self._current_model() or self.default_model
            if model_id is None:
                raise ModelNotFound("No model is loaded and none was asked for.",
                                    param="model")
            w = self.worker
            if w is not None and w.alive and w.model_id == model_id:
                return w
            if w is not None and w.dist_config is not None and w.model_id == model_id \
                    and w.dead_reason != "stopped":
                raise WorkerFailed(f"The distributed instance of {model_id} is not running "
                                   f"({w.dead_reason}). "
                                   + (self.heal_note(model_id) or "Launch it again."))
            return await self._start(model_id, self.resolve(model_id), None, self.kv_bits)

    async def start_worker(self, model_id: str, path: Path,
                           dist_config: Path | None = None,
                           kv_bits: int | None = None, engine: str = "auto",
                           handover: bool = False) -> WorkerHandle:
        """Start (replacing any current one) the worker this node serves requests with;
        `kv_bits` quantizes the KV of one that serves alone (a group's ranks read theirs
        from the config); `engine` and `handover` choose what runs it
        (engine/node/cpu_engine.py)."""
        async with self._load_lock:
            return await self._start(model_id, path, dist_config, kv_bits, engine, handover)

    def rank_flags(self) -> tuple[str, ...]:
        """The flags of a rank this node runs for another node's group (its own memory
        cap, disk tier and hand-over folder; the rest comes in its config)."""
        return self._worker_flags("", None, group=True)

    def _worker_flags(self, model_id: str, kv_bits: int | None, group: bool
                      ) -> tuple[str, ...]:
        """A worker's flags beyond the node's own: the admission budget and the prefix
        cache's disk tier (each rank of a group its own share, engine/runtime/
        group/disk.py); for one that serves alone also its KV bits and context limit (a
        group's ranks read those from their config)."""
        out = [*(("--memory-limit", str(self.memory_limit)) if self.memory_limit else ())]
        if self.prefix_disk_bytes > 0:
            out += ["--prefix-disk", str(self.home / "cache" / "prefix"),
                    "--prefix-disk-bytes", str(self.prefix_disk_bytes)]
        if group:  # where its rank reads a prefill node's KV (engine/node/handover_group.py)
            from engine.node.handover import folder
            return (*out, "--handover-dir", str(folder(self.home)))
        limit = self.model_settings.context_limit(model_id)
        out += [*(("--kv-bits", str(kv_bits)) if kv_bits else ()),
                *(("--context-limit", str(limit)) if limit else ())]
        return tuple(out)

    async def _start(self, model_id: str, path: Path, dist_config: Path | None,
                     kv_bits: int | None = None, engine: str = "auto",
                     handover: bool = False) -> WorkerHandle:
        from engine.node.cpu_engine import choose
        plan = self.prefill  # a prefill node's KV comes in through MLX's cache
        handover = handover or (plan is not None and getattr(plan, "model", None) == model_id)
        try:  # refused before the running worker is stopped
            await self.check_model(path)
            engine = "mlx" if dist_config is not None else await asyncio.to_thread(
                choose, engine, path, kv_bits=kv_bits,
                drafting="--draft-model" in self.worker_args, handover=handover)
        except ShoalError as e:
            if self.worker is None or not self.worker.alive:
                self._set(RunnerFailed(model_id, e.message))  # the status says why
            raise
        w = self.worker
        if w is not None:
            w.dead_reason = w.dead_reason or f"The model was switched to {model_id}."
            await w.stop()
        self._set(RunnerLoading(model_id))
        w = WorkerHandle(model_id, path, logs_dir(self.home) / "worker.log",
                         self._on_worker_event, self.token_timeout, dist_config=dist_config,
                         streams=self.max_streams, queue_wait_s=self.queue_wait_s,
                         worker_args=self.worker_args + self._worker_flags(
                             model_id, kv_bits, group=dist_config is not None)
                         + (("--engine", engine) if engine != "mlx" else ()))
        w.engine = engine
        w.metrics = self.metrics
        if dist_config is not None:
            w.fail_hint = lambda: self.heal_hint(model_id)
        self.worker = w
        try:
            ready = await w.start()
        except ShoalError as e:
            self._set(RunnerFailed(model_id, e.message))
            raise
        self._used = time.monotonic()  # a keep-alive counts from ready, not from the load
        self._set(RunnerReady(model_id, ready.context_length, ready.pid,
                              capabilities=list(ready.capabilities),
                              engine=engine if engine != "mlx" else None))
        log.info("model %s ready in %.1f s (worker pid %s)", model_id, ready.load_s, ready.pid)
        return w

    async def stop_worker(self, failure: str | None = None) -> None:
        """Stop the current worker; with a failure reason the node shows it as failed."""
        async with self._load_lock:
            w = self.worker
            if w is not None:
                w.dead_reason = w.dead_reason or failure or "stopped"
                await w.stop()
            self._set(RunnerFailed(w.model_id if w else None, failure) if failure else RunnerIdle())

    def keep(self, task: asyncio.Task) -> None:
        """Hold a background task until it ends (and cancel it at close)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _current_model(self) -> str | None:
        return getattr(self.runner, "model", None)

    def load_in_background(self, model_id: str | None) -> None:
        async def run() -> None:
            try:
                await self.ensure_loaded(model_id)
            except ShoalError as e:
                log.error("loading %s failed: %s", model_id, e.message)
                if not isinstance(self.runner, RunnerFailed):  # e.g. unknown model: show why
                    self._set(RunnerFailed(model_id, e.message))
        self.keep(asyncio.get_running_loop().create_task(run()))

    def prepare_in_background(self, model_id: str, step: str,
                              prepare: Callable[[], str | None]) -> None:
        """Run `prepare` (blocking: off the loop) with the status saying `step`, then load
        the model it returns."""
        what = f"{step[0].upper()}{step[1:]}"

        async def run() -> None:
            self._set(RunnerPreparing(model_id, step))
            try:
                ready = await asyncio.to_thread(prepare)
            except Exception as e:  # a failed import says why, and the node stays up
                log.exception("%s failed", step)
                self._set(RunnerFailed(model_id, f"{what} failed: {e}"))
                return
            if ready is None:
                self.default_model = None
                self._set(RunnerFailed(model_id, f"{what} failed: see the node's log."))
                return
            self.load_in_background(ready)
        self._preparing = asyncio.get_running_loop().create_task(run())
        self.keep(self._preparing)

    def _on_worker_event(self, ev: protocol.Message) -> None:
        if isinstance(ev, protocol.Loading) and isinstance(self.runner, RunnerLoading):
            self._set(RunnerLoading(self.runner.model, ev.done, ev.total))
        elif isinstance(ev, protocol.Exited) and self.worker is not None \
                and ev.reason != "stopped":
            if self.worker.dead_reason == ev.reason and isinstance(self.runner, RunnerReady):
                self._set(RunnerFailed(self.runner.model, ev.reason))

    def on_turn(self, busy: bool) -> None:
        self._used = time.monotonic()
        r = self.runner
        if isinstance(r, RunnerReady):
            self._set(replace(r, generating=busy))

    async def unload(self, idle: RunnerIdle | None = None) -> None:
        async with self._load_lock:
            if self.worker is not None:
                self.worker.dead_reason = "stopped"
                await self.worker.stop()
                self.worker = None
            self._set(idle or RunnerIdle())

    def idle_limit(self, model: str) -> float | None:
        """Seconds `model` may sit unused before it is unloaded (None: never)."""
        return self.keep_alive.get(model, self.keep_alive_s)

    def expires_in(self, model: str) -> float | None:
        """Seconds until the loaded `model` unloads if nobody uses it (None: never)."""
        if model in self.beside.workers:
            return self.beside.expires_in(model)
        limit, w = self.idle_limit(model), self.worker
        if limit is None or w is None or w.dist_config is not None:
            return None
        return limit if w.in_flight else max(0.0, limit - (time.monotonic() - self._used))

    async def unload_when_idle(self, every: float = 1.0) -> None:
        """Unload a one-process model nobody used for its keep-alive (as Ollama does);
        the next request for it loads it again. Runs until cancelled."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.beside.unload_idle()
            except Exception:  # one model's failed stop must not end the idle check
                log.exception("unloading an idle model beside the main one failed")
            w, r = self.worker, self.runner
            if w is None or not w.alive or w.dist_config is not None or w.in_flight \
                    or not isinstance(r, RunnerReady):
                continue
            limit, unused = self.idle_limit(r.model), time.monotonic() - self._used
            if limit is not None and unused >= limit:
                log.info("unloading %s: unused for %.0f s (keep-alive %.0f s)", r.model,
                         unused, limit)
                await self.unload(RunnerIdle(unloaded=r.model, idle_s=round(unused, 1)))

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await self.beside.close()
        if self.worker is not None:
            self.worker.dead_reason = self.worker.dead_reason or "stopped"
            await self.worker.stop()
