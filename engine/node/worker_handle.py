"""The node's side of one worker process: start it, talk to it, notice when it dies.

One generation runs at a time; a request that arrives meanwhile waits its turn, so outputs
never mix. A cancelled request keeps the worker busy until the worker confirms the stop
(within one token), and a worker that won't confirm is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.errors import Overloaded, ShoalError, WorkerFailed
from engine.logs import rotate_if_big
from engine.platform.cpu import worker_env
from engine.protocol import (
    TERMINAL,
    AdoptKV,
    Cancel,
    Embed,
    Embedded,
    Error,
    Event,
    Exited,
    Fatal,
    Generate,
    GenerateRequest,
    KVAdopted,
    KVWritten,
    Loading,
    Message,
    PrefillKV,
    Ranked,
    Ready,
    Rerank,
    Shutdown,
    decode,
    encode,
)

log = logging.getLogger(__name__)


class WorkerHandle:
    def __init__(self, model_id: str, model_path: Path, log_path: Path,
                 on_event: Callable[[Any], None],  # takes a protocol.Message
                 token_timeout: float = 300.0, dist_config: Path | None = None,
                 streams: int = 1, queue_wait_s: float = 60.0,
                 worker_args: tuple[str, ...] = ()):
        self.model_id = model_id
        self.worker_args = worker_args  # e.g. the node's drafting flags
        self.dist_config = dist_config
        self.engine = "mlx"  # or "llamacpp" (engine/node/cpu_engine.py)
        self.model_path = model_path
        self.ready: Ready | None = None  # the worker's ready message, once loaded
        self.log_path = log_path
        self.token_timeout = token_timeout
        self._on_event = on_event
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        # Requests in flight at once: what the worker said it takes (it batches them), at
        # most `streams`; the rest wait up to queue_wait_s for a turn.
        self.max_streams, self.queue_wait_s = streams, queue_wait_s
        self._turn = asyncio.Semaphore(1)
        self.waiting = 0
        self._ready: asyncio.Future | None = None
        self.dead_reason: str | None = None
        # a group's: what a request that fails with the group is told happens next
        self.fail_hint: Callable[[], str | None] | None = None
        # engine.node.metrics.NodeMetrics (set by the node): each request's figures
        self.metrics: Any = None
        self._tracks: dict[str, Any] = {}

    @property
    def in_flight(self) -> int:
        return len(self._queues)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self.dead_reason

    async def start(self, timeout: float = 600.0) -> Ready:
        """Spawn the worker and wait until its model is loaded. Returns the ready event."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_if_big(self.log_path)  # the worker writes it itself: rotated between runs
        logf = self.log_path.open("ab")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "engine.runtime.worker",
                "--model", str(self.model_path), "--model-id", self.model_id,
                "--streams", str(self.max_streams),
                *(["--dist", str(self.dist_config)] if self.dist_config else []),
                *self.worker_args,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=logf, env=worker_env(), limit=16 * 1024 * 1024)
        finally:
            logf.close()
        self._ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())
        try:
            ready: Ready = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
            self.ready = ready
            takes = ready.streams
            self._turn = asyncio.Semaphore(max(1, min(takes, self.max_streams)))
            return ready
        except TimeoutError:
            await self.stop()
            raise WorkerFailed(f"Loading {self.model_id} took longer than {timeout:.0f} s; "
                               f"see {self.log_path}.") from None
        except BaseException:
            await self.stop()
            raise

    async def _read(self) -> None:
        assert self._proc and self._proc.stdout
        while True:
            try:
                line = await self._proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue
            if not line:
                break
            try:
                ev = decode(line)
            except (ValueError, TypeError):
                log.warning("worker sent a malformed line: %r", line[:200])
                continue
            if isinstance(ev, (Loading, Ready, Fatal)):
                self._on_event(ev)
                if isinstance(ev, Ready) and self._ready and not self._ready.done():
                    self._ready.set_result(ev)
                if isinstance(ev, Fatal) and self._ready and not self._ready.done():
                    self._ready.set_exception(_load_error(ev))
                continue
            rid = getattr(ev, "id", "")
            q = self._queues.get(rid)
            if q is not None:
                self._put(rid, q, ev)
        code = await self._proc.wait()
        if not self.dead_reason:
            self.dead_reason = self._exit_reason(code)
            log.error("%s", self.dead_reason)
        failure = WorkerFailed(self.dead_reason)
        if self._ready and not self._ready.done():
            self._ready.set_exception(failure)
        for rid, q in self._queues.items():
            self._put(rid, q, Error(rid, failure.code, failure.message, None,
                                    failure.status))
        self._on_event(Exited(code, self.dead_reason))

    def _exit_reason(self, code: int) -> str:
        """What the clients of the requests in flight are told when the worker ends on its
        own: the signal that ended it and the ids of those requests, which its log names
        (a crash's dump follows the line of the request it was serving)."""
        how = f" (exit code {code})"
        if code < 0:
            name = _signal_name(-code)
            how = f": it was killed ({name})" if -code in KILLED else f": it crashed ({name})"
        serving = list(self._queues)
        if serving:
            shown = ", ".join(serving[:SHOWN_IDS])
            more = f" and {len(serving) - SHOWN_IDS} more" if len(serving) > SHOWN_IDS else ""
            how += f" while serving request{'s' if len(serving) > 1 else ''} {shown}{more}"
        elif code < 0:
            how += " with no request in flight"
        return (f"The worker for {self.model_id} exited unexpectedly{how}; its log is "
                f"{self.log_path} on {socket.gethostname()}."  # the message may reach
                # a client of another node; a group's rank is not restarted by a request
                + ("" if self.dist_config else " The next request starts a new one."))

    def _send(self, cmd: Message) -> None:
        if not self.alive or not self._proc or not self._proc.stdin:
            raise WorkerFailed(self.dead_reason or "The worker is not running.")
        self._proc.stdin.write(encode(cmd))

    @contextlib.asynccontextmanager
    async def generate(self, request: GenerateRequest,
                       on_turn: Callable[[bool], None] | None = None
                       ) -> AsyncIterator[AsyncIterator[Event]]:
        """Context manager yielding the request's events (Accepted, Delta/ToolCall…,
        Done | Error). Leaving early cancels the generation in the worker."""
        rid = uuid.uuid4().hex
        # a count (tokenize, count_tokens) is no generation: not a request in /metrics
        track = None if self.metrics is None or request.count_only \
            else self.metrics.start(self.model_id)
        await self._wait_turn()
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        if track is not None:
            track.begin()
            self._tracks[rid] = track
        finished = False

        async def events() -> AsyncIterator[Event]:
            nonlocal finished
            while True:
                try:  # prefill progress counts: a long prompt is work, not silence
                    ev = await asyncio.wait_for(q.get(), self.token_timeout)
                except TimeoutError:
                    finished = True
                    await self.kill(f"The worker for {self.model_id} produced nothing for "
                                    f"{self.token_timeout:.0f} s and was stopped.")
                    failed = WorkerFailed(self.dead_reason or "The worker stalled.")
                    stalled = Error(rid, failed.code, failed.message, None, failed.status)
                    if (t := self._tracks.get(rid)) is not None:
                        t.see(stalled)
                    yield stalled
                    return
                if isinstance(ev, TERMINAL):
                    finished = True
                if isinstance(ev, Error) and ev.code in GROUP_LOST and self.fail_hint \
                        and (hint := self.fail_hint()):
                    ev = replace(ev, message=re.sub(
                        r"[;.] [Tt]he instance must be restarted\.$", ".", ev.message)
                        + " " + hint)
                yield ev
                if finished:
                    return

        try:
            if on_turn:
                on_turn(True)
            self._send(Generate(rid, request))
            yield events()
        finally:
            self._leave(rid, q, on_turn, finished)

    async def embed(self, cmd: Embed, on_turn: Callable[[bool], None] | None = None
                    ) -> Embedded | Error:
        """Send one Embed and await its answer (Embedded, or Error)."""
        return await self._ask(cmd, on_turn, len(cmd.inputs))  # type: ignore[return-value]

    async def rerank(self, cmd: Rerank, on_turn: Callable[[bool], None] | None = None
                     ) -> Ranked | Error:
        """Send one Rerank and await its answer (Ranked, or Error)."""
        return await self._ask(cmd, on_turn,  # type: ignore[return-value]
                               len(cmd.documents) + 1)

    async def prefill_kv(self, cmd: PrefillKV) -> KVWritten | Error:
        """Have the worker write the KV of cmd.tokens to cmd.path (for another node);
        bounded by a second per 256 tokens beyond token_timeout."""
        return await self._ask(cmd, None,  # type: ignore[return-value]
                               len(cmd.tokens) // 256 + 1)

    async def adopt_kv(self, cmd: AdoptKV) -> KVAdopted | Error:
        """Have the worker keep the KV another node wrote to cmd.path."""
        return await self._ask(cmd, None, 1)  # type: ignore[return-value]

    async def _ask(self, cmd: Embed | Rerank | PrefillKV | AdoptKV,
                   on_turn: Callable[[bool], None] | None,
                   items: int) -> Event:
        """One command with one answer: queued for a turn as a generation is, its wait
        bounded by token_timeout and a second per input (the worker says nothing until
        the whole answer, which takes longer the more inputs it has); a caller that leaves
        (the client went away) cancels it in the worker, whose turn ends when the worker
        confirms."""
        rid = uuid.uuid4().hex
        await self._wait_turn()
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        finished = False
        bound = self.token_timeout + items * SECONDS_PER_INPUT
        try:
            if on_turn:
                on_turn(True)
            self._send(replace(cmd, id=rid))
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), bound)
                except TimeoutError:
                    finished = True
                    await self.kill(f"The worker for {self.model_id} answered nothing for "
                                    f"{bound:.0f} s and was stopped.")
                    failed = WorkerFailed(self.dead_reason or "The worker stalled.")
                    return Error(rid, failed.code, failed.message, None, failed.status)
                if isinstance(ev, TERMINAL):
                    finished = True
                    return ev
        finally:
            self._leave(rid, q, on_turn, finished)

    def _leave(self, rid: str, q: asyncio.Queue, on_turn: Callable[[bool], None] | None,
               finished: bool) -> None:
        """A request's end: its turn ends where the worker finished it (or died); a caller
        that left early (client gone, Stop) cancels it and keeps the worker's turn until
        the worker confirms, so the next request can't see this one's output."""
        if finished or not self.alive:
            self._end_turn(rid, on_turn)
            return
        with contextlib.suppress(WorkerFailed):
            self._send(Cancel(rid))
        asyncio.get_running_loop().create_task(self._drain(rid, q, on_turn))

    async def _drain(self, rid: str, q: asyncio.Queue,
                     on_turn: Callable[[bool], None] | None) -> None:
        """After a cancel: the request's remaining events until its end. Only a worker
        silent about it for CANCEL_GRACE_S is stuck (its progress counts as an answer)."""
        try:
            while not isinstance(await asyncio.wait_for(q.get(), CANCEL_GRACE_S), TERMINAL):
                pass
        except TimeoutError:
            await self.kill(f"The worker for {self.model_id} did not stop when asked.")
        finally:
            self._end_turn(rid, on_turn)

    def _put(self, rid: str, q: asyncio.Queue, ev: Any) -> None:
        if (t := self._tracks.get(rid)) is not None:
            t.see(ev)
        q.put_nowait(ev)

    def _end_turn(self, rid: str, on_turn: Callable[[bool], None] | None) -> None:
        self._queues.pop(rid, None)
        if (t := self._tracks.pop(rid, None)) is not None:
            t.end()
        self._turn.release()
        if on_turn:
            on_turn(False)

    async def kill(self, reason: str) -> None:
        self.dead_reason = self.dead_reason or reason
        if self._proc and self._proc.returncode is None:
            self._proc.kill()
            with contextlib.suppress(ProcessLookupError):
                await asyncio.wait_for(self._proc.wait(), 10)

    async def _wait_turn(self) -> None:
        """A place among the requests the worker serves at once, within queue_wait_s."""
        self.waiting += 1
        try:
            await asyncio.wait_for(self._turn.acquire(), self.queue_wait_s)
        except TimeoutError:
            raise Overloaded(f"{self.model_id} is serving as many requests as it takes and "
                             f"none finished within {self.queue_wait_s:.0f} s; try again "
                             "shortly.") from None
        finally:
            self.waiting -= 1

    async def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit, then make sure it has: nothing is left running."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            self.dead_reason = self.dead_reason or "stopped"
            with contextlib.suppress(Exception):
                proc.stdin.write(encode(Shutdown()))  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), grace)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
        if self._reader:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._reader, grace)


CANCEL_GRACE_S = 15.0
SECONDS_PER_INPUT = 1.0  # an Embed's or Rerank's wait grows by this per text it carries
SHOWN_IDS = 8  # request ids named in a crash's message; the rest are counted
KILLED = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT}  # sent, not a fault of its own


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

GROUP_LOST = ("peer_lost", "group_failed")  # a request failed because its group broke


def _load_error(ev: Fatal) -> ShoalError:
    """A worker's fatal load error as the error of its kind (a damaged file, a model that
    can't run), so the client gets that status; else WorkerFailed."""
    known = ShoalError.from_openai({"error": {"message": ev.message, "code": ev.code}}, 500)
    return known if type(known) is not ShoalError else WorkerFailed(ev.message, code=ev.code)
