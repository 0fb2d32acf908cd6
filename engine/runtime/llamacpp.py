"""The llama.cpp engine: a model a Linux CPU node serves alone, run by llama.cpp (xllamacpp's
in-process server) from the GGUF file it was imported from. On the CPU llama.cpp reads the
GGUF's 4-5 bit weights where MLX reads them unpacked to float32, so it decodes several times
faster (docs/benchmarks.md); engine/node/cpu_engine.py says when a node uses it.

Shoal still does everything around the model: the chat template and tokenizer, tool calls,
stop strings and stop tokens, special tokens' display, logprobs' shape, the context's
bounds. llama.cpp takes the prompt's token ids and streams back one token at a time, its id
in the logprobs, sampled by its own samplers as engine/runtime/llamacpp_body.py maps the
request's fields (or refuses them by name). Its batching (one slot a stream) and prompt
cache (each slot keeps its last prompt) are its own.

llama.cpp's server always listens; here it listens on a Unix socket in a folder only this
user can open, behind a random API key, so nothing on the network or in a browser reaches
it."""

from __future__ import annotations

import logging
import os
import queue
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from engine.errors import BadRequest, ShoalError
from engine.protocol import GenerateRequest, Loading
from engine.runtime.engine import Emit, Engine
from engine.runtime.generate import Record, decode_tps
from engine.runtime.llamacpp_body import body, refuse
from engine.runtime.sampling import Sampling

log = logging.getLogger(__name__)
POLL_S = 0.25  # how often a request waiting on llama.cpp looks at its cancel
KV_SHARE = 4  # the KV of every slot together takes at most a quarter of the memory


class LlamaCppEngine(Engine):
    capabilities: ClassVar[frozenset[str]] = frozenset({"generate"})

    def __init__(self, server: Any, tokenizer: Any, context_length: int, streams: int,
                 limit: int, folder: str):
        self.server, self.tokenizer = server, tokenizer
        self.context_length, self.streams, self.limit = context_length, streams, limit
        self._folder = folder  # the socket's: removed at close

    def generate(self, rid: str, request: GenerateRequest, cancel: threading.Event,
                 emit: Emit) -> None:
        from engine.runtime.request import run

        if request.sampling.prompt_logprobs is not None:
            raise BadRequest("'prompt_logprobs' can't be served by this node's llama.cpp "
                             "engine. Leave it out, or serve the model with MLX (launch it "
                             "with \"engine\": \"mlx\").", param="prompt_logprobs")
        refuse(request.sampling)  # before the answer starts: a stream's 400 too
        run(rid, request, None, self.tokenizer, self.context_length, self.stream, cancel,
            emit, self.limit)

    def stream(self, _model: Any, tokenizer: Any, prompt: list[int], sampling: Sampling,
               cancel: threading.Event, progress: Callable[[int, int, int], None] | None = None
               ) -> Iterator[Record]:
        """Records for `prompt` as engine.runtime.generate's: one a token, the last with
        its finish reason."""
        from engine.runtime.rules import eos_ids, own_finish, stop_tokens
        from engine.runtime.stops import Shown

        asked = body(prompt, sampling)
        if "grammar" in asked:
            _check_grammar(asked["grammar"], sampling)
        chunks: queue.Queue[Any] = queue.Queue()
        gone = threading.Event()  # the reader stopped: llama.cpp stops at its next chunk

        def on_chunk(chunk: Any) -> bool:
            chunks.put(chunk)
            return gone.is_set() or cancel.is_set()

        def call() -> None:
            try:
                self.server.handle_completions(asked, on_chunk)
            except Exception as e:  # (xllamacpp raises what llama.cpp refused)
                chunks.put(e)
            finally:
                chunks.put(None)

        threading.Thread(target=call, name="llamacpp-request", daemon=True).start()
        shown, ends = Shown(tokenizer, sampling), stop_tokens(sampling, tokenizer)
        eos = sorted(eos_ids(tokenizer))
        tell = progress or (lambda cached, done, total: None)
        n, cached, tic, first, prompt_tps = 0, 0, time.perf_counter(), 0.0, 0.0

        def record(text: str, token: int | None, finish: str | None,
                   lp: float | None = None, top: tuple[tuple[int, float], ...] = (),
                   hit: str | None = None) -> Record:
            now = time.perf_counter()
            return Record(text, token, finish, len(prompt), n, prompt_tps,
                          decode_tps(n, now - first) if n else 0.0, 0.0, lp, top, hit,
                          cached)

        try:
            while True:
                try:
                    chunk = chunks.get(timeout=POLL_S)
                except queue.Empty:
                    if cancel.is_set() and n == 0:  # mid-prefill: leave at once
                        yield record("", None, "cancelled")
                        return
                    continue
                if chunk is None:
                    break
                _check_chunk(chunk)
                step = chunk.get("prompt_progress")
                if isinstance(step, dict):
                    cached = int(step.get("cache") or 0)
                    tell(cached, min(int(step.get("processed") or 0), len(prompt)),
                         len(prompt))
                choice = (chunk.get("choices") or [{}])[0]
                for entry in (choice.get("logprobs") or {}).get("content") or ():
                    token, n = int(entry["id"]), n + 1
                    if n == 1:
                        first = time.perf_counter()
                        prompt_tps = (len(prompt) - cached) / max(first - tic, 1e-9)
                    text, finish, hit = shown.step(
                        token, own_finish(token, n, sampling, ends), cancel)
                    lp, top = _logprobs(entry, sampling.logprobs)
                    yield record(text, token, finish, lp, top,
                                 shown.matched if hit else None)
                    if finish is not None:
                        return
                reason = choice.get("finish_reason")
                if reason == "stop" and eos:  # an end-of-turn token it doesn't stream
                    n += 1
                    text, finish, _ = shown.step(eos[0], "stop", cancel)
                    yield record(text, eos[0], finish)
                    return
                if reason is not None:  # its own end (the context full, say)
                    yield record(shown.stops.flush(), None, "length")
                    return
            if n == 0 and cancel.is_set():
                yield record("", None, "cancelled")
                return
            raise ShoalError("llama.cpp ended the answer without saying why.",
                             code="generation_failed")
        finally:
            gone.set()

    def close(self, grace_s: float = 4.0) -> None:
        self.server = None  # its destructor ends llama.cpp's loop
        shutil.rmtree(self._folder, ignore_errors=True)


def _check_chunk(chunk: Any) -> None:
    if isinstance(chunk, Exception):
        raise ShoalError(f"llama.cpp failed: {chunk}", code="generation_failed")
    if not isinstance(chunk, dict):
        raise ShoalError("llama.cpp sent something that isn't an answer.",
                         code="generation_failed")
    err = chunk.get("error") if isinstance(chunk.get("error"), dict) else \
        chunk if "choices" not in chunk and "message" in chunk else None
    if err is not None:
        raise ShoalError(f"llama.cpp refused the request: {err.get('message')}",
                         code="generation_failed")


def _logprobs(entry: dict[str, Any], asked: int | None
              ) -> tuple[float | None, tuple[tuple[int, float], ...]]:
    if asked is None:
        return None, ()
    top = tuple((int(t["id"]), float(t["logprob"]))
                for t in entry.get("top_logprobs") or ())[:asked]
    return float(entry["logprob"]), top


def _check_grammar(text: str, sampling: Sampling) -> None:
    """llama.cpp logs a grammar it can't read and answers unconstrained: so the text is
    read here first, by the same library, and refused where it doesn't read."""
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(text))
    if error:
        param = (sampling.constraint or {}).get("param") or "response_format"
        raise BadRequest(f"This node's llama.cpp engine can't take the answer's "
                         f"constraint: {error[:300]}", param=param)


def load_engine(model_dir: str, args: Any, emit: Emit) -> LlamaCppEngine:
    """llama.cpp serving the GGUF file the folder was imported from (engine/node/
    cpu_engine.py found it), with the folder's tokenizer. Raises ShoalError where it can't
    load."""
    import xllamacpp

    from engine.hub.bundled import bundled_gguf
    from engine.hub.checkpoint import model_context, read_config
    from engine.hub.gguf_source import gguf_source
    from engine.runtime.admission import kv_bytes_per_token
    from engine.runtime.load import load_tokenizer

    folder = Path(model_dir)
    source = gguf_source(folder, bundled_gguf())
    if source is None:
        raise ShoalError(f"{model_dir} has no GGUF file for llama.cpp to serve.",
                         code="load_failed")
    config = read_config(folder)
    tokenizer = load_tokenizer(folder, config)
    streams = max(1, args.streams)
    ctx = min(model_context(config), args.context_limit or 1 << 62)
    per_token = kv_bytes_per_token(config, None) or 1
    room = (args.memory_limit or _memory()) // KV_SHARE
    ctx = max(256, min(ctx, room // (per_token * streams)))
    emit(Loading(0, 1))
    sock = tempfile.mkdtemp(prefix="shoal-llamacpp-")  # 0700: this user alone
    p = xllamacpp.CommonParams()
    p.model.path = str(source)
    p.hostnames = [os.path.join(sock, "server.sock")]
    p.api_keys = [secrets.token_urlsafe(32)]
    p.ui = False
    p.verbosity = 2  # its warnings and errors in the worker's log, not a line a slot event
    p.n_parallel, p.n_ctx, p.kv_unified = streams, ctx * streams, False
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = xllamacpp.Server(p)
    except Exception as e:
        shutil.rmtree(sock, ignore_errors=True)
        raise ShoalError(f"llama.cpp couldn't load {source.name}: {e}",
                         code="load_failed") from e
    finally:  # llama.cpp takes SIGINT and SIGTERM for itself: the worker's own come back
        for s, h in handlers.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
    emit(Loading(1, 1))
    # one past the largest id both the tokenizer and llama.cpp's vocabulary take
    limit = min(n for n in (int(config.get("vocab_size") or 0), len(tokenizer)) if n > 0)
    log.info("llama.cpp serves %s: %d streams of %d tokens, %d threads", source.name,
             streams, ctx, threads)
    return LlamaCppEngine(server, tokenizer, ctx, streams, limit, sock)


def _memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30
