"""The text engine: a language model through mlx-lm, one request at a time or batched
(mlx-lm's BatchGenerator), with drafts, a prefix cache (in memory, on disk too) and
admission by memory. Rank 0 of a group serves through the same engine with the group's
generator (engine/runtime/group/rank.py)."""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from engine.errors import BadRequest, ShoalError
from engine.protocol import (
    AdoptKV,
    Error,
    GenerateRequest,
    KVAdopted,
    KVWritten,
    Loading,
    PrefillKV,
    Progress,
)
from engine.runtime.engine import Emit, Engine

log = logging.getLogger(__name__)
Generator = Callable[..., Iterator[Any]]


class TextEngine(Engine):
    """A loaded text model and the generator that serves it (`gen`: one process's, or a
    group's rank 0's); `on_request(id, active)` is told when each request starts and
    ends."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"generate"})
    vision: Any = None  # a vision model's tower (engine.runtime.vision.tower.Vision)

    def __init__(self, model: Any, tokenizer: Any, context_length: int, gen: Generator,
                 streams: int = 1,
                 on_request: Callable[[str, bool], None] = lambda rid, active: None):
        from engine.runtime.bounds import token_limit

        self.model, self.tokenizer, self.gen = model, tokenizer, gen
        self.context_length, self.streams = context_length, max(1, streams)
        self.on_request = on_request
        self.limit = token_limit(model, tokenizer)  # every request's ids are checked against it
        self.kv_bits: int | None = None  # the KV's bits (None: the model's own)
        self.folder = ""  # the checkpoint's folder
        self.kv_layout: Any = None  # engine.runtime.handover.layout_of's, made at load
        self._fingerprint: str | None = None

    def generate(self, rid: str, request: GenerateRequest, cancel: threading.Event,
                 emit: Emit) -> None:
        from engine.runtime.request import run

        if self.vision is None and (request.images or _has_image_parts(request)):
            raise BadRequest("This model doesn't take images: it reads text only. Send "
                             "the request to a model that takes images (a vision model), "
                             "or leave the images out.", param="messages",
                             code="images_unsupported")
        self.on_request(rid, True)
        try:
            run(rid, request, self.model, self.tokenizer, self.context_length, self.gen,
                cancel, emit, self.limit, vision=self.vision)
        finally:
            self.on_request(rid, False)

    def prefill_kv(self, cmd: PrefillKV, cancel: threading.Event, emit: Emit) -> None:
        """The prompt's KV for another node (engine/runtime/handover.py), written to the
        file the node passes on as it grows; run on this command's own thread beside the
        requests this engine serves. Each chunk done is a Progress: work, not silence."""
        from engine.runtime.handover import Cancelled, prefill_stream
        from engine.runtime.quant_kv import KV

        self._check_ids(cmd.tokens)
        n = len(cmd.tokens)
        try:
            with Path(cmd.path).open("wb") as out:
                took = prefill_stream(self.model, KV.for_model(self.model, self.kv_bits),
                                      cmd.tokens, out, cancel, made_by=self.fingerprint(),
                                      progress=lambda done: emit(Progress(cmd.id, 0, done, n)))
        except Cancelled:
            emit(Error(cmd.id, "cancelled", "The prefill was cancelled.", None, 499))
            return
        emit(KVWritten(cmd.id, Path(cmd.path).stat().st_size, round(took, 4)))

    def adopt_kv(self, cmd: AdoptKV, cancel: threading.Event, emit: Emit) -> None:
        """Another node's KV for cmd.tokens, read from the file the node writes as the
        frames arrive (until their end, or the node's cancel), into the prefix cache."""
        from engine.runtime.handover import Cancelled, adopt_stream, tail
        from engine.runtime.quant_kv import KV

        self._check_ids(cmd.tokens)
        n = len(cmd.tokens)
        try:
            cache = adopt_stream(self.model, KV.for_model(self.model, self.kv_bits),
                                 cmd.tokens, tail(Path(cmd.path), cancel), self.fingerprint(),
                                 self.kv_layout,
                                 progress=lambda done: emit(Progress(cmd.id, 0, done, n)))
        except Cancelled:
            emit(Error(cmd.id, "cancelled", "The hand-over was cancelled.", None, 499))
            return
        prefix = getattr(self.gen, "prefix", None)
        if prefix is None or not prefix.adopt(cmd.tokens, cache):
            raise BadRequest("This node keeps no prefix cache to decode from another "
                             "node's prefill (its prefix cache is off or too small).")
        emit(KVAdopted(cmd.id, len(cmd.tokens)))

    def fingerprint(self) -> str:
        """The checkpoint's and the KV bits' (what a hand-over's two sides must share)."""
        from engine.runtime.disk_cache import fingerprint
        if self._fingerprint is None:
            self._fingerprint = fingerprint(Path(self.folder), self.kv_bits) \
                if self.folder else ""
        return self._fingerprint

    def _check_ids(self, ids: list[int]) -> None:
        """Token ids from another node, checked as a client's are; a group's ranks run
        the model only together, so a group prefills for no other node (it takes another
        node's prefill in through GroupLeader.adopt_kv)."""
        if self.rank is not None:
            raise BadRequest("A model split over several nodes can't prefill for another "
                             "node: name a node that holds the whole model.")
        self._valid_ids(ids)

    def _valid_ids(self, ids: list[int]) -> None:
        if not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                              and 0 <= t < self.limit for t in ids):
            raise BadRequest(f"The prompt's token ids must be whole numbers from 0 to "
                             f"{self.limit - 1}.", param="tokens")
        if len(ids) >= self.context_length:
            raise BadRequest(f"The prompt's {len(ids)} tokens don't fit the model's "
                             f"{self.context_length}-token context.", param="tokens")

    def close(self, grace_s: float = 4.0) -> None:
        rest = getattr(self.gen, "rest", None)
        if rest is not None:  # the last answer's KV is kept (on disk too) before we go
            rest(grace_s)


def _has_image_parts(request: GenerateRequest) -> bool:
    return any(p.get("type") == "image" for m in request.messages or ()
               for p in m.get("parts") or ())


def load_text_engine(model_dir: str, args: argparse.Namespace, emit: Emit) -> TextEngine:
    """A one-process text engine as the worker's flags say. Raises ShoalError (with the
    code the node shows) where the model, its draft model or its KV bits can't be used."""
    from engine.hub.checkpoint import model_context
    from engine.runtime.load import load_model
    from engine.runtime.prefix import default_budget

    try:
        model, tokenizer, config = load_model(
            Path(model_dir), lambda done, total: emit(Loading(done, total)))
    except ShoalError:
        raise
    except Exception as e:  # anything mlx-lm raises on a model it can't build
        log.exception("loading %s failed", model_dir)
        raise ShoalError(f"Couldn't load the model in {model_dir}: {e}",
                         code="load_failed") from e
    ctx = min(model_context(config), args.context_limit or 1 << 62)
    budget = default_budget(ctx) if args.prefix_cache_tokens is None \
        else max(0, args.prefix_cache_tokens)
    try:
        drafting = load_drafting(args, tokenizer, model)
    except ShoalError:
        raise
    except Exception as e:  # a draft model that can't load, or can't serve this target
        log.exception("the draft model %s can't be used", args.draft_model)
        raise ShoalError(f"Couldn't use the draft model {args.draft_model}: {e}",
                         code="draft_refused") from e
    try:
        gen, streams = one_process_generator(model, tokenizer, config, args.streams, budget,
                                             drafting, args.kv_bits,
                                             disk_tier(args, model), args.memory_limit)
    except ValueError as e:  # quantized KV this model's heads can't take
        raise ShoalError(f"Couldn't quantize the KV cache of {args.model_id}: {e}",
                         code="kv_bits_refused") from e
    engine = TextEngine(model, tokenizer, ctx, gen, streams)
    from engine.runtime.handover import layout_of
    from engine.runtime.quant_kv import KV
    engine.kv_bits, engine.folder = args.kv_bits, model_dir
    engine.kv_layout = layout_of(model, KV.for_model(model, args.kv_bits))
    return engine


def one_process_generator(model: Any, tokenizer: Any, config: dict[str, Any], streams: int,
                          prefix_tokens: int, drafting: Any = None, kv_bits: int | None = None,
                          disk: Any = None, memory_limit: int | None = None
                          ) -> tuple[Generator, int]:
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


def admitted(gen: Generator, admission: Any, prefix: Any) -> Generator:
    """One request at a time: each must fit alone (a 503 where it can't)."""
    def run(model: Any, tokenizer: Any, prompt: list[int], sampling: Any,
            *args: Any, **kwargs: Any) -> Iterator[Any]:
        admission.check(admission.need(len(prompt), 0, sampling.max_tokens), 0,
                        prefix.drop_oldest)
        yield from gen(model, tokenizer, prompt, sampling, *args, **kwargs)
    run.prefix = prefix  # type: ignore[attr-defined]  # (TextEngine.adopt_kv keeps KV there)
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

