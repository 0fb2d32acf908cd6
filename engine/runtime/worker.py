"""The worker process: loads one model behind the Engine seam (engine/runtime/engine.py)
and serves it, driven by its node over pipes.

Protocol: the typed messages of engine/protocol.py, one JSON line each. The node writes
commands to stdin (Generate, Embed, Rerank, Cancel, Shutdown); the worker writes events to
its stdout (Loading, Ready, Accepted, Delta, ToolCall, Done, Embedded, Ranked, Error,
Fatal). Everything else the process prints goes to stderr, which the node sends to a log
file.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from engine.errors import BadRequest, ShoalError
from engine.protocol import (
    AdoptKV,
    Cancel,
    Embed,
    Error,
    Fatal,
    Generate,
    Message,
    PrefillKV,
    Ready,
    Rerank,
    Shutdown,
    decode,
    encode,
    make,
)
from engine.runtime.engine import Engine

log = logging.getLogger("engine.runtime.worker")


class Emitter:
    """Writes one message per line to the node; safe from any thread. Takes a Message, or
    (for callers not yet moved to the types) a tag and its fields."""

    def __init__(self, out: BinaryIO):
        self._out = out
        self._lock = threading.Lock()

    def __call__(self, msg: Message | str, **fields: Any) -> None:
        line = encode(make(msg, **fields) if isinstance(msg, str) else msg)
        with self._lock:
            self._out.write(line)
            self._out.flush()

    def close(self) -> None:
        """No event after this one gets out (the process is about to exit)."""
        self._lock.acquire()


def claim_stdout() -> BinaryIO:
    """Keep the real stdout for events and point fd 1 at stderr, so stray prints from
    libraries can never corrupt the event stream."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def read_commands(commands: queue.Queue[Message | None],
                  cancels: dict[str, threading.Event]) -> None:
    """stdin reader thread: cancels act at once, everything else is queued in order."""
    for raw in sys.stdin.buffer:
        try:
            cmd = decode(raw)
        except (ValueError, TypeError, RecursionError):  # a line nested ~1000 deep
            log.warning("ignoring a malformed command line: %r", raw[:200])
            continue
        if isinstance(cmd, Cancel):
            ev = cancels.get(cmd.id)
            if ev is not None:
                ev.set()
            continue
        if isinstance(cmd, (Generate, Embed, Rerank, PrefillKV, AdoptKV)):
            cancels[cmd.id] = threading.Event()
        commands.put(cmd)
    commands.put(None)  # the node closed our stdin: it is gone or wants us gone


def serve(engine: Engine, emit: Emitter) -> None:
    """Hand each command to the engine: in order, or each on its own thread where the
    engine serves several at once (the node sends no more at once than Ready said)."""
    commands: queue.Queue[Message | None] = queue.Queue()
    cancels: dict[str, threading.Event] = {}
    reader = threading.Thread(target=read_commands, args=(commands, cancels), daemon=True)
    reader.start()
    while (cmd := commands.get()) is not None:
        if isinstance(cmd, Shutdown):
            break
        if not isinstance(cmd, (Generate, Embed, Rerank, PrefillKV, AdoptKV)):
            continue
        if engine.streams > 1:
            threading.Thread(target=_serve_one, name=f"request-{cmd.id[:8]}", daemon=True,
                             args=(engine, cmd, cancels, emit)).start()
        else:
            _serve_one(engine, cmd, cancels, emit)
    reader.join(timeout=2.0)  # the node closes our stdin after Shutdown: its EOF ends it


def _serve_one(engine: Engine, cmd: Generate | Embed | Rerank | PrefillKV | AdoptKV,
               cancels: dict[str, threading.Event], emit: Emitter) -> None:
    rid = cmd.id
    cancel = cancels.get(rid) or threading.Event()
    # the node names this id when the worker crashes: a crash's dump in the log sits
    # after the line of each request it was serving
    log.info("request %s started", rid)
    try:
        if isinstance(cmd, Generate):
            engine.generate(rid, cmd.request, cancel, emit)
        elif isinstance(cmd, Embed):
            engine.embed(cmd, cancel, emit)
        elif isinstance(cmd, Rerank):
            engine.rerank(cmd, cancel, emit)
        elif isinstance(cmd, PrefillKV):
            engine.prefill_kv(cmd, cancel, emit)
        else:
            engine.adopt_kv(cmd, cancel, emit)
    except ShoalError as e:
        emit(Error(rid, e.code, e.message, e.param, e.status))
    except (TypeError, ValueError, KeyError) as e:  # a request the checks let through
        log.exception("request %s failed", rid)
        emit(Error(rid, BadRequest.code, f"The request could not be served: {e}",
                   None, 400))
    except Exception as e:  # the worker stays up for the next request
        log.exception("request %s failed", rid)
        what = "generation" if isinstance(cmd, Generate) else cmd.tag  # embed, rerank
        emit(Error(rid, f"{what}_failed", f"{what.capitalize()} failed: {e}", None, 500))
    finally:
        cancels.pop(rid, None)


def _reexec_with_quiet_blas_threads() -> None:
    """OpenBLAS's idle threads spin for ~0.1 s after every call before they sleep. In a
    group whose ranks share cores the next rank computes during exactly that time, at half
    speed (measured: 2-rank pipeline 0.69× → 1.0× of one process). The timeout is read only
    when the library starts, so a rank started without it runs itself again with it."""
    if (sys.platform != "linux" or "openblas" not in os.environ.get("LD_PRELOAD", "")
            or "OPENBLAS_THREAD_TIMEOUT" in os.environ):
        return
    env = {**os.environ, "OPENBLAS_THREAD_TIMEOUT": "4"}  # OpenBLAS's minimum: 2^4 cycles
    os.execve(sys.executable, [sys.executable, "-m", "engine.runtime.worker", *sys.argv[1:]],
              env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="shoal-worker")
    p.add_argument("--model", required=True, help="model folder")
    p.add_argument("--model-id", required=True)
    p.add_argument("--dist", type=Path, default=None,
                   help="this rank's distributed config (JSON); serve one model as a group")
    p.add_argument("--streams", type=int, default=1,
                   help="requests decoded together (continuous batching when above 1)")
    p.add_argument("--prefix-cache-tokens", type=int, default=None,
                   help="the prefix cache's budget in tokens (default: as many as the "
                        "context the planner counts it for; 0: off)")
    p.add_argument("--speculative", choices=("on", "off"), default="on",
                   help="draft tokens where it pays (a request may still ask either way)")
    p.add_argument("--draft-model", default=None, help="a draft model's folder (its "
                   "tokenizer must be the target's); without one, drafts come from prompt "
                   "lookup")
    p.add_argument("--draft-tokens", type=int, default=6, choices=range(1, 17),
                   metavar="1..16", help="the most guesses per pass (default 6)")
    p.add_argument("--handover-dir", type=Path, default=None, metavar="DIR",
                   help="where this rank's node writes another node's prefill for the "
                        "group to take in (engine/runtime/group/adopt.py)")
    p.add_argument("--prefix-disk", type=Path, default=None, metavar="DIR",
                   help="keep finished prompts' KV on disk here too (a folder per model)")
    p.add_argument("--prefix-disk-bytes", type=int, default=0,
                   help="the disk prefix cache's size per model")
    p.add_argument("--memory-limit", type=int, default=None, metavar="BYTES",
                   help="admit requests only while what MLX holds stays under this (default:"
                        " what Metal may wire on a Mac, what the OS has available elsewhere)")
    p.add_argument("--context-limit", type=int, default=None, metavar="TOKENS",
                   help="serve less context than the model declares (the user's limit)")
    p.add_argument("--engine", choices=("mlx", "llamacpp"), default="mlx",
                   help="what runs a model served alone: MLX, or llama.cpp from the GGUF "
                        "file it was imported from (engine/node/cpu_engine.py chooses)")
    p.add_argument("--kv-bits", type=int, default=None, choices=(4, 8),
                   help="quantize the KV cache to 8 or 4 bits (default: the model's 16; "
                        "a group takes its ranks' from --dist)")
    args = p.parse_args(argv)
    if args.dist is not None and argv is None:
        _reexec_with_quiet_blas_threads()
    # a native crash (a segfault, an abort in MLX) leaves every thread's Python stack in
    # the worker's log (stderr), after the line of the request that was running
    faulthandler.enable(file=sys.stderr, all_threads=True)
    emit = Emitter(claim_stdout())
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s worker %(levelname)s %(name)s: %(message)s")
    from engine.logs import OncePerSecond
    for h in logging.getLogger().handlers:  # a warning repeated in a flood: once a second
        h.addFilter(OncePerSecond())
    from engine.runtime.factory import make_engine

    t0 = time.perf_counter()
    try:
        engine = make_engine(args.model, args, emit)
    except ShoalError as e:
        emit(Fatal(e.code, e.message))
        return 1
    except Exception as e:  # anything a loader raises on a model it can't build
        log.exception("loading %s failed", args.model)
        emit(Fatal("load_failed", f"Couldn't load the model in {args.model}: {e}"))
        return 1
    emit(Ready(args.model_id, engine.context_length, os.getpid(),
               round(time.perf_counter() - t0, 3), engine.streams, engine.rank,
               sorted(engine.capabilities)))
    serve(engine, emit)
    engine.close()  # within the node's grace (WorkerHandle.stop)
    return 0


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    # Not sys.exit: a daemon thread still blocked reading stdin (a node that sent Shutdown
    # and kept the pipe open) aborts the interpreter's teardown with SIGABRT, which the
    # node would report as a crash. What must outlive us was written by engine.close().
    os._exit(code)
