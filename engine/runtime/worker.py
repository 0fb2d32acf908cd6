"""The worker process: loads one model and generates, driven by its node over pipes.

Protocol: the typed messages of engine/protocol.py, one JSON line each. The node writes
commands to stdin (Generate, Cancel, Shutdown); the worker writes events to its stdout
(Loading, Ready, Accepted, Delta, ToolCall, Done, Error, Fatal). Everything else the process
prints goes to stderr, which the node sends to a log file.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from engine.errors import BadRequest, ShoalError
from engine.protocol import (
    Cancel,
    Error,
    Fatal,
    Generate,
    Loading,
    Message,
    Ready,
    Shutdown,
    decode,
    encode,
    make,
)

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
        if isinstance(cmd, Generate):
            cancels[cmd.id] = threading.Event()
        commands.put(cmd)
    commands.put(None)  # the node closed our stdin: it is gone or wants us gone


def serve(model: Any, tokenizer: Any, ctx_len: int, emit: Emitter,
          gen: Callable[..., Iterator[Any]] | None = None,
          on_request: Callable[[str, bool], None] = lambda rid, active: None,
          concurrent: bool = False) -> None:
    """Run requests one at a time, or each on its own thread when `gen` batches them
    (`concurrent`; the node sends no more at once than the worker said it takes). `gen`
    replaces the one-process generator (rank 0 of a group); `on_request(id, active)` is
    told when each request starts and ends."""
    from engine.runtime.bounds import token_limit
    from engine.runtime.generate import generate

    gen = gen or generate
    limit = token_limit(model, tokenizer)  # every request's ids are checked against it
    commands: queue.Queue[Message | None] = queue.Queue()
    cancels: dict[str, threading.Event] = {}
    threading.Thread(target=read_commands, args=(commands, cancels), daemon=True).start()
    while (cmd := commands.get()) is not None:
        if isinstance(cmd, Shutdown):
            break
        if not isinstance(cmd, Generate):
            continue
        if concurrent:
            threading.Thread(target=_serve_one, name=f"request-{cmd.id[:8]}", daemon=True,
                             args=(cmd, model, tokenizer, ctx_len, gen, cancels, emit,
                                   on_request, limit)).start()
        else:
            _serve_one(cmd, model, tokenizer, ctx_len, gen, cancels, emit, on_request, limit)


def _serve_one(cmd: Generate, model: Any, tokenizer: Any, ctx_len: int,
               gen: Callable[..., Iterator[Any]], cancels: dict[str, threading.Event],
               emit: Emitter, on_request: Callable[[str, bool], None],
               limit: int | None = None) -> None:
    from engine.runtime.request import run

    rid = cmd.id
    # the node names this id when the worker crashes: a crash's dump in the log sits
    # after the line of each request it was serving
    log.info("request %s started", rid)
    try:
        on_request(rid, True)
        run(rid, cmd.request, model, tokenizer, ctx_len, gen, cancels[rid], emit, limit)
    except ShoalError as e:
        emit(Error(rid, e.code, e.message, e.param, e.status))
    except (TypeError, ValueError, KeyError) as e:  # a request the checks let through
        log.exception("request %s failed", rid)
        emit(Error(rid, BadRequest.code, f"The request could not be served: {e}",
                   None, 400))
    except Exception as e:  # the worker stays up for the next request
        log.exception("request %s failed", rid)
        emit(Error(rid, "generation_failed", f"Generation failed: {e}", None, 500))
    finally:
        on_request(rid, False)
        cancels.pop(rid, None)


def one_process_generator(model: Any, tokenizer: Any, config: dict[str, Any], streams: int,
                          prefix_tokens: int, drafting: Any = None, kv_bits: int | None = None,
                          disk: Any = None, memory_limit: int | None = None
                          ) -> tuple[Callable[..., Iterator[Any]], int]:
    """(the generator a one-process worker serves with, the requests it takes at once):
    mlx-lm's BatchGenerator for several, one at a time where the family can't batch; with
    `drafting` (engine.runtime.drafting.Drafting) requests decode with drafts; `kv_bits`
    quantizes the KV (a ValueError where the model's heads can't be); `disk`
    (engine.runtime.disk_cache.DiskCache) keeps finished prompts' KV on disk too. Every
    request is admitted where its KV fits (engine/runtime/admission.py; `memory_limit`
    the user's cap in bytes)."""
    from functools import partial

    from engine.placement.families import batching_refusal
    from engine.runtime.admission import Admission, kv_bytes_per_token
    from engine.runtime.drafting import Drafting, drafted_generate
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.quant_kv import KV

    drafting = drafting if drafting is not None else Drafting(enabled=False)
    admission = Admission(kv_bytes_per_token(config, kv_bits), memory_limit)

    prefix, streams = PrefixCache(prefix_tokens, disk=disk), max(1, streams)
    why = batching_refusal(str(config.get("model_type")))
    if why and streams > 1:
        log.warning("%s", why)
        streams = 1
    if streams > 1:
        from engine.runtime.batching import Batcher
        return Batcher(model, tokenizer, prefix, streams, drafting=drafting,
                       kv_bits=kv_bits, admission=admission), streams
    kv = KV.for_model(model, kv_bits)  # (the Batcher makes its own)
    return admitted(partial(drafted_generate, drafting, prefix=prefix, kv=kv), admission,
                    prefix), 1


def admitted(gen: Callable[..., Iterator[Any]], admission: Any,
             prefix: Any) -> Callable[..., Iterator[Any]]:
    """One request at a time: each must fit alone (a 503 where it can't)."""
    def run(model: Any, tokenizer: Any, prompt: list[int], sampling: Any,
            *args: Any, **kwargs: Any) -> Iterator[Any]:
        admission.check(admission.need(len(prompt), 0, sampling.max_tokens), 0,
                        prefix.drop_oldest)
        yield from gen(model, tokenizer, prompt, sampling, *args, **kwargs)
    return run


def disk_tier(args: argparse.Namespace, model: Any) -> Any:
    """The prefix cache's disk tier its flags ask for (None: none, or its folder can't be
    read, which the log says)."""
    if args.prefix_disk is None or args.prefix_disk_bytes <= 0:
        return None
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    from engine.runtime.disk_cache import DiskCache, fingerprint
    try:
        folder = args.prefix_disk / fingerprint(Path(args.model), args.kv_bits)
    except OSError as e:
        log.warning("no prefix cache on disk: can't read the model's files (%s)", e)
        return None
    return DiskCache(folder, args.prefix_disk_bytes,
                     can_trim_prompt_cache(make_prompt_cache(model)))


def load_drafting(args: argparse.Namespace, tokenizer: Any, target: Any = None) -> Any:
    """The worker's drafting as its flags say; a draft model that can't serve this target
    (another vocabulary) is refused, naming both. Its guesses stay within the token ids
    both it and the `target` model take."""
    from engine.runtime.bounds import model_vocab, token_limit
    from engine.runtime.drafting import Drafting
    from engine.runtime.load import load_model
    from engine.runtime.speculative import check_draft

    if args.draft_model is None:
        return Drafting(enabled=args.speculative == "on", max_draft=args.draft_tokens)
    draft, draft_tok, _ = load_model(Path(args.draft_model), lambda done, total: None)
    check_draft(tokenizer, draft_tok, args.model_id, Path(args.draft_model).name)
    limits = [model_vocab(draft), token_limit(target, tokenizer) if target is not None else None]
    return Drafting(enabled=args.speculative == "on", draft_model=draft,
                    max_draft=args.draft_tokens,
                    limit=min((n for n in limits if n), default=None))


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
    p.add_argument("--prefix-disk", type=Path, default=None, metavar="DIR",
                   help="keep finished prompts' KV on disk here too (a folder per model)")
    p.add_argument("--prefix-disk-bytes", type=int, default=0,
                   help="the disk prefix cache's size per model")
    p.add_argument("--memory-limit", type=int, default=None, metavar="BYTES",
                   help="admit requests only while what MLX holds stays under this (default:"
                        " what Metal may wire on a Mac, what the OS has available elsewhere)")
    p.add_argument("--context-limit", type=int, default=None, metavar="TOKENS",
                   help="serve less context than the model declares (the user's limit)")
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
    if args.dist is not None:
        from functools import partial

        from engine.runtime.group.rank import run_rank
        return run_rank(args.model, args.model_id, args.dist, emit, serve,
                        max(1, args.streams), partial(load_drafting, args),
                        (args.prefix_disk, args.prefix_disk_bytes), args.memory_limit)
    from engine.runtime.checkpoint import model_context
    from engine.runtime.load import load_model

    t0 = time.perf_counter()
    try:
        model, tokenizer, config = load_model(
            Path(args.model), lambda done, total: emit(Loading(done, total)))
    except ShoalError as e:
        emit(Fatal(e.code, e.message))
        return 1
    except Exception as e:  # anything mlx-lm raises on a model it can't build
        log.exception("loading %s failed", args.model)
        emit(Fatal("load_failed", f"Couldn't load the model in {args.model}: {e}"))
        return 1
    ctx = min(model_context(config), args.context_limit or 1 << 62)
    from engine.runtime.prefix import default_budget
    budget = default_budget(ctx) if args.prefix_cache_tokens is None \
        else max(0, args.prefix_cache_tokens)
    try:
        drafting = load_drafting(args, tokenizer, model)
    except ShoalError as e:
        emit(Fatal(e.code, e.message))
        return 1
    except Exception as e:  # a draft model that can't load, or can't serve this target
        log.exception("the draft model %s can't be used", args.draft_model)
        emit(Fatal("draft_refused", f"Couldn't use the draft model {args.draft_model}: {e}"))
        return 1
    try:
        gen, streams = one_process_generator(model, tokenizer, config, args.streams, budget,
                                             drafting, args.kv_bits,
                                             disk_tier(args, model), args.memory_limit)
    except ValueError as e:  # quantized KV this model's heads can't take
        emit(Fatal("kv_bits_refused", f"Couldn't quantize the KV cache of "
                                      f"{args.model_id}: {e}"))
        return 1
    emit(Ready(args.model_id, ctx, os.getpid(), round(time.perf_counter() - t0, 3), streams))
    serve(model, tokenizer, ctx, emit, gen=gen, concurrent=streams > 1)
    rest = getattr(gen, "rest", None)
    if rest is not None:  # the last answer's KV is kept (on disk too) before we go
        rest(4.0)  # within the node's grace (WorkerHandle.stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
