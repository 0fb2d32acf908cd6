"""Continuous batching in the one-process worker: every request in flight decodes in one
mlx-lm BatchGenerator, and long prompts are prefilled in chunks between decode steps.

Prompts are prefilled in chunks sized by time (engine/runtime/chunking.py) between
decode steps, so a request arriving during a long prefill waits about one chunk.
One scheduler thread owns the BatchGenerator (MLX state is not shared across threads);
each request's thread hands it a prompt and reads its tokens back from a queue, and turns
them into the same `Record`s engine/runtime/generate.py yields, so the worker's request
path (tool calls, reasoning, stops, logprobs) is the same batched or not.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.runtime.chunking import BESIDE, LARGEST, Chunker
from engine.runtime.drafting import Drafting
from engine.runtime.generate import ProgressFn, Record, decode_tps
from engine.runtime.sampling import Sampling
from engine.runtime.stops import Shown
from engine.runtime.vision.batched import Filling
from engine.runtime.vision.positions import joining

log = logging.getLogger(__name__)


CANCEL_POLL_S = 0.1


@dataclass(frozen=True)
class Prefilled:
    """On a job's queue: `done` of its prompt's tokens are in (`cached` of them cached)."""
    cached: int
    done: int


@dataclass
class Job:
    """One request handed to the scheduler thread."""
    prompt: list[int]
    sampling: Sampling
    tokenizer: Any
    out: queue.Queue[Any] = field(default_factory=queue.Queue)
    uid: int | None = None
    cached: int = 0
    sampler: Any = None  # made once on the scheduler thread, kept across hand-overs
    processors: list[Any] = field(default_factory=list)
    emitted: int = 0
    drafted: int = 0  # speculative decoding: guesses made and kept
    accepted: int = 0
    started: float = 0.0  # when it began decoding (the drafting log line's figure)
    cut: bool = False  # memory ran short: its next token is its last ("length")
    cancel: threading.Event | None = None  # set when its client leaves
    ends: frozenset[int] = frozenset()  # the tokens that end it (rules.stop_tokens)
    images: Any = None  # engine.runtime.vision.images.ImagePrompt: prefilled as embeddings
    export: int = -1  # a group's prefill for another node: the hand-over's number

    @property
    def key(self) -> list[int]:
        """The prompt as the prefix cache keys it (an image's tokens by its sha256)."""
        return self.images.keys if self.images is not None else self.prompt

    def __post_init__(self) -> None:
        from engine.runtime.rules import stop_tokens
        if self.tokenizer is not None:
            self.ends = stop_tokens(self.sampling, self.tokenizer)


class Streams:
    """The request side of a batched generator: a request's thread hands its prompt to the
    scheduler thread (which does every MLX operation) and turns the tokens that come back
    into `Record`s. Items on a job's queue: (token, (logprob, top), finish) or an error."""

    def __init__(self) -> None:
        self._inbox: queue.Queue[tuple[str, Job]] = queue.Queue()
        self._jobs: dict[int, Job] = {}

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    def __call__(self, model: Any, tokenizer: Any, prompt: list[int], sampling: Sampling,
                 cancel: threading.Event | None = None,
                 progress: ProgressFn | None = None, images: Any = None) -> Iterator[Record]:
        job = Job(prompt, sampling, tokenizer, cancel=cancel, images=images)
        self._inbox.put(("add", job))
        shown = Shown(tokenizer, sampling)
        tic, first, n, done = time.perf_counter(), 0.0, 0, False
        try:
            while True:
                try:  # a cancel is seen within CANCEL_POLL_S, even mid-prefill
                    item = job.out.get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    if n == 0 and cancel is not None and cancel.is_set():
                        yield Record("", None, "cancelled", len(prompt), 0, 0.0, 0.0,
                                     _peak_gb(), cached_tokens=job.cached)
                        return  # the finally removes it from the batch
                    continue
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Prefilled):
                    if progress is not None:
                        progress(item.cached, item.done, len(prompt))
                    continue
                token, lp, finish = item
                n += 1
                if n == 1:
                    first = time.perf_counter()
                text, finish, hit = shown.step(token, finish, cancel)
                now = time.perf_counter()
                yield Record(text=text, token=token, finish_reason=finish,
                             prompt_tokens=len(prompt), generation_tokens=n,
                             prompt_tps=(len(prompt) - job.cached) / max(first - tic, 1e-9),
                             generation_tps=decode_tps(n, now - first),
                             peak_memory_gb=_peak_gb(), logprob=lp[0], top_logprobs=lp[1],
                             stop_sequence=shown.matched if hit else None,
                             cached_tokens=job.cached, drafted_tokens=job.drafted,
                             accepted_tokens=job.accepted)
                if finish is not None:
                    done = item[2] is not None  # the batch itself ended it
                    return
        finally:
            if not done:  # ended here (stop string, cancel, client gone): free its slot
                self._inbox.put(("remove", job))


class Batcher(Streams):
    """The worker's generator when requests may run together (see serve()). Every MLX
    operation happens on the scheduler thread; request threads only handle text."""

    def __init__(self, model: Any, tokenizer: Any, prefix: Any, streams: int,
                 chunker: Chunker | None = None, drafting: Drafting | None = None,
                 kv_bits: int | None = None, admission: Any = None):
        from mlx_lm.generate import BatchGenerator

        from engine.runtime.batch_drafts import DraftedBatch
        from engine.runtime.quant_kv import KV

        super().__init__()
        self.model, self.prefix, self.streams = model, prefix, streams
        self.kv = KV.for_model(model, kv_bits)  # 8 or 4 bits (quant_kv.py), or 16
        self.admission = admission  # engine.runtime.admission.Admission, or None
        self._steps = 0  # decode steps, for the memory guard
        self._steady = False  # the last step ran no prompt's chunk or join
        self._held: list[Job] = []  # admitted once those in flight leave room
        self.chunker = chunker or Chunker(least=BESIDE)
        eos = [[int(t)] for t in tokenizer.eos_token_ids]
        self._eos = {t for (t,) in eos}
        # requests draft in the batch (engine/runtime/batch_drafts.py); refused guesses
        # must be trimmed
        self.drafting = drafting if drafting is not None and _trimmable(model) else None
        self._gen = BatchGenerator(model, stop_tokens=eos, completion_batch_size=streams,
                                   prefill_batch_size=streams, prefill_step_size=LARGEST)
        self._batch: Any = None  # batch_drafts.DraftedBatch where requests may draft
        if self.drafting is not None:  # mlx-lm 0.32.2 never replaces its generation batch
            self._batch = DraftedBatch(model, self._gen.sampler, self.drafting.governor_for)
            self._gen._generation_batch = self._batch
        # linear-attention state and sliding windows can't be rewound: keep a copy at each
        # prompt's end
        self._recurrent = prefix.budget_tokens > 0 and not _trimmable(model)
        self._filling = Filling(model, prefix, self.chunker, self._recurrent,  # images
                                Prefilled)
        self._resting = threading.Event()  # nothing in flight, every finish kept
        threading.Thread(target=self._run, name="batcher", daemon=True).start()

    def rest(self, timeout: float) -> bool:
        """Wait (bounded) until the last request's KV is kept (in memory and, with a disk
        tier, on disk): a worker shutting down right after an answer must not cut the
        write short."""
        return self._resting.wait(timeout)

    # --- the scheduler thread -------------------------------------------------------------
    def _run(self) -> None:
        from engine.runtime.sampling import token_logprobs

        while True:
            if not self._jobs and not self._filling:
                self._resting.set()
            self._take(block=not self._jobs and not self._filling)
            self._resting.clear()
            if self._filling:
                self._fill_step()
            if not self._jobs:
                continue
            try:
                self._plan_prefill()
                with self._gen.stats() as st:
                    prompts, responses = self._gen.next()
                self.chunker.took(st.prompt_tokens, st.prompt_time)
                if self._steady and not prompts and st.generation_tokens:
                    self.chunker.decoded(st.wall_time)  # one decode step, alone
                self._steady = not prompts  # no prompt's work to wait for next step
                if self._batch is not None:  # its next step's time is a pass's own
                    self._batch.steady = self._steady
                for p in prompts:
                    if p.end_of_segment and not p.end_of_prompt and self._recurrent:
                        self._snapshot(p.uid)  # all of a prompt but its last token is in
                    job = self._jobs.get(p.uid)
                    if job is not None and isinstance(p.progress, tuple):
                        job.out.put(Prefilled(job.cached, job.cached + int(p.progress[0])))
            except Exception as e:  # the batch's state is unknown: fail what is in it
                log.exception("batched generation failed")
                for job in list(self._jobs.values()):
                    job.out.put(RuntimeError(f"generation failed: {e}"))
                self._gen.remove(list(self._jobs))
                self._jobs.clear()
                if self._batch is not None:
                    self._batch.rows.clear()
                continue
            finished = False
            for r in responses:
                owner = self._jobs.get(r.uid)
                if owner is None:
                    continue
                token = int(r.token)
                lp = token_logprobs(r.logprobs, token, owner.sampling.logprobs)
                owner.emitted += 1
                if owner.emitted == 1:
                    owner.started = time.perf_counter()
                if owner.cut and r.finish_reason is None:  # memory ran short (_guard)
                    owner.out.put((token, lp, "length"))
                    self._drop(r.uid)
                    self._gen.remove([r.uid])
                    finished = True
                    continue
                owner.out.put((token, lp, r.finish_reason))
                if r.finish_reason is not None:
                    self._drop(r.uid)
                    tokens = list(r.all_tokens or [])
                    if owner.images is not None:  # keyed by the images' hashes
                        tokens[:len(owner.key)] = owner.key
                    self._keep(tokens, r.prompt_cache)
                    finished = True
            self._guard(responses)
            if self._held and finished:
                self._admit_held()  # someone finished: room for those waiting?

    def _plan_prefill(self) -> None:
        """This step's prompt work (mlx-lm reads both fields at each step). A step
        returns its decode tokens only after its prompt work, so while a prompt moves to
        decoding, or waits for its first token, new prompts join only while their work
        is about one decode step's (a turn whose history is cached): its first token
        isn't held back by the next arrivals' prefill (a wave of 16 chat turns got every
        first token after all 16 prefilled; now the first ones come as they are ready)."""
        gen = self._gen
        # alone: no answer decodes yet, so none waits on a large chunk
        gen.prefill_step_size = self.chunker.size(alone=not len(gen._generation_batch))
        current = gen._currently_processing  # [segments left, done, total] each
        ending = any(len(c[0]) == 1 and len(c[0][0]) == 1 for c in current)
        fresh = any(j.emitted == 0 for uid in gen._generation_batch.uids
                    if (j := self._jobs.get(uid)) is not None)
        if not (ending or fresh):
            gen.prefill_batch_size = self.streams
            return
        joins, used, cheap = 0, 0, self.chunker.one_step()
        for seq in gen._unprocessed_sequences:  # (uid, segments left, ...): in order
            used += sum(len(p) for p in seq[1])
            if used > cheap:
                break
            joins += 1
        gen.prefill_batch_size = len(current) + joins

    def _fill_step(self) -> None:
        """One chunk of an image request's prefill; it joins the batch once done."""
        try:
            done = self._filling.step(alone=not self._jobs)
        except Exception as e:
            log.exception("prefilling an image request failed")
            self._filling.fail(RuntimeError(f"generation failed: {e}"))
            return
        if done is not None:
            job, cache, start = done
            try:
                self._insert(job, cache, start)
            except Exception as e:  # e.g. a grammar that can't be built
                job.out.put(e)

    def _guard(self, responses: list[Any]) -> None:
        """Every GUARD_STEPS decode steps: where memory can't hold the answers' next
        steps, the longest ends at its next token (engine/runtime/admission.py)."""
        from engine.runtime.admission import GUARD_STEPS

        if self.admission is None or not responses:
            return
        self._steps += 1
        rows = [j for j in self._jobs.values() if j.emitted and not j.cut]
        if self._steps % GUARD_STEPS or not rows or \
                not self.admission.running_short(len(rows), self.prefix.drop_oldest):
            return
        longest = max(rows, key=lambda j: j.emitted)
        longest.cut = True
        log.warning("memory: too little left for the answers' next steps; the longest "
                    "(%d tokens) ends here", longest.emitted)

    def _take(self, block: bool) -> None:
        """Apply the requests' adds and removes (waiting for one when idle); prompts whose
        clients left go first (_sweep)."""
        self._sweep()
        while True:
            try:
                kind, job = self._inbox.get(block=block)
            except queue.Empty:
                return
            block = False
            if kind == "add":
                self._sweep()
                try:
                    self._add(job)
                except Exception as e:  # e.g. a grammar that can't be built, no room
                    job.out.put(e)
            elif job in self._held:
                self._held.remove(job)
            elif self._filling.leave(job):
                pass
            elif job.uid in self._jobs:
                self._leave(job.uid)
                if self._held:
                    self._admit_held()

    def _sweep(self) -> None:
        """Prompts whose clients left mid-prefill leave now, before anyone joins: the node
        sends the cancel before a retry, so a retry sent at once finds what they
        prefilled (their own threads would tell this one only at their next poll)."""
        self._filling.sweep()
        left = [uid for uid, j in self._jobs.items()
                if not j.emitted and j.cancel is not None and j.cancel.is_set()]
        for uid in left:
            self._leave(uid)
        if left and self._held:
            self._admit_held()

    def _leave(self, uid: int) -> None:
        """A request leaves before its end; one still prefilling leaves the chunks it did
        in the prefix cache (engine/runtime/prefix.py partial()), its cache as it stands."""
        from engine.runtime.generate import cache_holds

        job = self._jobs[uid]
        self._drop(uid)
        # (stage 1: mlx-lm's prompt batch; a sequence that moved on to decode may have fed
        # its last token already, which recurrent state wouldn't show)
        if job.emitted or self._gen._find_uids([uid]).get(uid, (0,))[0] != 1:
            self._gen.remove([uid])
            return
        got = self._gen.remove([uid], return_prompt_caches=True).get(uid)
        if got is None:
            return
        cache, tokens = got[0], list(got[1] or [])
        n = len(tokens)
        if job.cached < n < len(job.prompt) and tokens == job.prompt[:n] \
                and cache_holds(cache, n):
            self.prefix.partial(job.key[:n], cache)

    def _add(self, job: Job) -> None:
        from engine.runtime.sampling import make_sampling

        job.sampler, job.processors = make_sampling(job.sampling, job.tokenizer)
        cache, job.cached = self.prefix.fetch(job.key)
        adm = self.admission
        if adm is not None and not adm.check(
                adm.need(len(job.prompt), job.cached, job.sampling.max_tokens),
                len(self._jobs) + len(self._filling), self.prefix.drop_oldest):
            self._held.append(job)  # (its prefix hit is looked up again when it starts)
            return
        if cache is None:
            cache = self.kv.make(self.model)
        if job.images is not None:  # prefilled from its embeddings first (vision/batched.py)
            self._filling.add(job, cache)
            job.out.put(Prefilled(job.cached, job.cached))
            return
        self._insert(job, cache, job.cached)

    def _insert(self, job: Job, cache: list[Any], start: int) -> None:
        """Into the batch, with `cache` holding the prompt's first `start` tokens."""
        from mlx_lm.generate import StopSequences

        from engine.runtime.batch_drafts import Row

        cache = joining(self.model, cache, job.images)  # Qwen-VL: rotates at offset + delta
        (uid,) = self._gen.insert([job.prompt[start:]],
                                  max_tokens=[job.sampling.max_tokens], caches=[cache],
                                  all_tokens=[job.prompt[:start]],
                                  samplers=[job.sampler], logits_processors=[job.processors],
                                  stop_sequences=[StopSequences(
                                      [(t,) for t in sorted(job.ends)] or None)])
        job.uid = uid
        self._jobs[uid] = job
        if self._batch is not None and self.drafting is not None \
                and self.drafting.wanted(job.sampling):
            self._batch.rows[uid] = Row(job, self.drafting.drafter())
        job.out.put(Prefilled(job.cached, job.cached))  # admitted: the cache hit is known

    def _admit_held(self) -> None:
        """Start the waiting requests that fit now, in order (a 503 for one that can't
        fit even alone)."""
        held, self._held = self._held, []
        for job in held:
            try:
                self._add(job)
            except Exception as e:
                job.out.put(e)

    def _drop(self, uid: int) -> None:
        """A request leaves the batch (finished, cancelled or gone): its drafting line."""
        job = self._jobs.pop(uid)
        if self._batch is not None and self._batch.rows.pop(uid, None) is not None:
            assert self.drafting is not None
            self.drafting.log_request(job.drafted, job.accepted, job.emitted,
                                      time.perf_counter() - (job.started or time.perf_counter()))

    def _snapshot(self, uid: int) -> None:
        job = self._jobs.get(uid)
        if job is not None:
            cache, _ = self._gen.extract_cache([uid])[uid]
            self.prefix.snapshot(job.key, cache)

    def _keep(self, tokens: Any, cache: Any) -> None:
        """A finished request's KV goes into the prefix cache (keyed as mlx-lm keys it)."""
        from engine.runtime.generate import cache_holds

        tokens = list(tokens or [])
        if cache is not None and tokens and cache_holds(cache, len(tokens)):
            self.prefix.finish(tokens, cache)


def _trimmable(model: Any) -> bool:
    """Whether every layer's cache can always be rewound: not a sliding window's ring
    (which can't once the prompt passes the window) nor recurrent state."""
    from mlx_lm.models.cache import (
        ArraysCache,
        CacheList,
        RotatingKVCache,
        make_prompt_cache,
    )

    def rewinds(c: Any) -> bool:
        if isinstance(c, CacheList):
            return all(rewinds(x) for x in c.caches)
        return not isinstance(c, (ArraysCache, RotatingKVCache))
    return all(rewinds(c) for c in make_prompt_cache(model))


def _peak_gb() -> float:
    import mlx.core as mx
    return float(mx.get_peak_memory() / 1e9)
