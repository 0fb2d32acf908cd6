"""Continuous batching across the ranks of a group (pipeline or tensor parallel).

Rank 0 schedules as engine/runtime/batching.py does on one node: the requests in flight
decode together in one batch, and prompts are prefilled one time-sized chunk at a time
between decode steps, the shortest remaining first, so a short request never waits behind
a long prompt for more than a chunk.

Every rank keeps the same state: the decoding sequences' KV in one batched cache per layer
(mlx-lm's BatchKVCache and friends: merge, extend, filter, extract) and each prefilling
prompt's own cache. Before each step rank 0 sends a `Plan`: which sequences leave (their KV
goes into the prefix cache on every rank), which prompts join (with how many of their
tokens rank 0's prefix cache gave), the tokens fed to the decode batch, and which prompt's
chunk runs. Every rank applies it in the same order, so caches and prefix tries stay alike.

On a pipeline rank 0 keeps two stages busy: it sends the decode batch on, computes the
prefill chunk while the next rank runs the decode batch, and only then takes the decode
output back, runs the head and samples, while the last rank works on the chunk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.runtime.batching import Job, Streams
from engine.runtime.chunking import Chunker
from engine.runtime.doorbell import BATCH, END, STEP, TOKEN
from engine.runtime.lockstep import DTYPES, Link
from engine.runtime.prefix import PrefixCache

log = logging.getLogger(__name__)

HEAD_LEN = 10


@dataclass
class Plan:
    """One step of the group, decided by rank 0."""

    drop: list[int] = field(default_factory=list)    # decoding sequences that leave
    cancel: list[int] = field(default_factory=list)  # prefilling prompts that leave
    keep: int = 0        # prefix cache entries rank 0 holds after the drops
    admit: list[list[int]] = field(default_factory=list)  # prompts that join
    cached: list[int] = field(default_factory=list)  # their tokens the prefix cache holds
    feed: list[int] = field(default_factory=list)    # one token per decoding sequence
    chunk: int = -1      # the prefilling prompt whose chunk runs (-1: none)
    chunk_len: int = 0
    hidden: int = 0
    dtype: str = DTYPES[0]

    def encode(self) -> tuple[Any, Any]:
        import mlx.core as mx

        ids = [t for p in self.admit for t in p]
        head = [len(self.drop), len(self.cancel), self.keep, len(self.admit), len(ids),
                len(self.feed), self.chunk, self.chunk_len, self.hidden,
                DTYPES.index(self.dtype)]
        body = [*self.drop, *self.cancel, *(len(p) for p in self.admit), *self.cached,
                *ids, *self.feed, 0]  # never empty
        return mx.array(head, dtype=mx.int32), mx.array(body, dtype=mx.int32)

    @staticmethod
    def body_len(head: list[int]) -> int:
        return head[0] + head[1] + 2 * head[3] + head[4] + head[5] + 1

    @classmethod
    def decode(cls, head: list[int], body: list[int]) -> Plan:
        nd, nc, keep, na, nids, nf, chunk, chunk_len, hidden, dt = head
        at = 0

        def take(n: int) -> list[int]:
            nonlocal at
            at += n
            return body[at - n:at]

        drop, cancel, lens, cached, ids, feed = (take(nd), take(nc), take(na), take(na),
                                                 take(nids), take(nf))
        admit, at = [], 0
        for n in lens:
            admit.append(ids[at:at + n])
            at += n
        return cls(drop, cancel, keep, admit, cached, feed, chunk, chunk_len, hidden,
                   DTYPES[dt])


@dataclass
class Seq:
    prompt: list[int]
    tokens: list[int]          # exactly the tokens its KV holds (its prefix cache key)
    cache: list[Any] | None    # its own cache while it prefills
    job: Job | None = None    # rank 0 only
    sample: Callable[[Any], tuple[int, Any]] | None = None
    generated: int = 0
    next: int | None = None    # the token it feeds at the next decode step

    @property
    def left(self) -> int:
        """Prompt tokens still to prefill (the last one runs in the decode batch)."""
        return len(self.prompt) - 1 - len(self.tokens)


def _extract(batch: list[Any], i: int) -> list[Any]:
    from mlx_lm.models.cache import ArraysCache

    out = []
    for c in batch:
        if isinstance(c, ArraysCache) and any(x is None for x in c.cache):
            out.append(ArraysCache(len(c.cache)))  # another rank's layer: holds nothing
        else:
            out.append(c.extract(i))
    return out


class State:
    """What every rank of the group holds about the requests in flight."""

    def __init__(self, prefix: PrefixCache, make_cache: Callable[[], list[Any]]):
        self.prefix, self.make_cache = prefix, make_cache
        self.pending: list[Seq] = []
        self.decoding: list[Seq] = []
        self.batch: list[Any] | None = None

    @property
    def idle(self) -> bool:
        return not self.pending and not self.decoding

    def drop(self, plan: Plan) -> None:
        """The plan's leavers go, decoding ones into the prefix cache."""
        for i in plan.drop:
            seq = self.decoding[i]
            assert self.batch is not None
            self.prefix.finish(seq.tokens, _extract(self.batch, i))
        if plan.drop:
            keep = [i for i in range(len(self.decoding)) if i not in set(plan.drop)]
            self.decoding = [self.decoding[i] for i in keep]
            if keep:
                assert self.batch is not None
                for c in self.batch:
                    c.filter(keep)
            else:
                self.batch = None
        gone = set(plan.cancel)
        self.pending = [s for i, s in enumerate(self.pending) if i not in gone]

    def admit(self, prompt: list[int], cache: list[Any] | None, cached: int) -> Seq:
        seq = Seq(prompt, list(prompt[:cached]), cache or self.make_cache())
        self.pending.append(seq)
        return seq

    def joined(self) -> None:
        """Prompts with only their last token left join the decode batch (that token is
        the first they feed)."""
        for seq in [s for s in self.pending if s.left == 0]:
            self.pending.remove(seq)
            assert seq.cache is not None
            self.prefix.snapshot(seq.prompt, seq.cache)
            merged = [c.merge([c]) for c in seq.cache]
            if self.batch is None:
                self.batch = merged
            else:
                for a, b in zip(self.batch, merged):
                    a.extend(b)
            seq.cache = None
            self.decoding.append(seq)

    def fed(self, plan: Plan) -> None:
        for seq, t in zip(self.decoding, plan.feed):
            seq.tokens.append(t)
        if plan.chunk >= 0:
            seq = self.pending[plan.chunk]
            seq.tokens += seq.prompt[len(seq.tokens):len(seq.tokens) + plan.chunk_len]


# --- the compute of one step, per strategy --------------------------------------------
class PipelineSteps:
    """Rank 0's part of a pipeline step (lead), and a follower's (receive, run)."""

    def __init__(self, stage: Any, link: Link):
        import mlx.core as mx

        self.stage, self.link = stage, link
        self.hidden, self.dtype = stage.hidden, stage.dtype
        self._dtype = getattr(mx, stage.dtype)

    def make_cache(self) -> list[Any]:
        return list(self.stage.make_cache())


    def lead(self, plan: Plan, state: State) -> Any:
        """Send the plan and run it; the decode batch's logits (B, vocab) or None."""
        import mlx.core as mx

        link, cfg, stage = self.link, self.link.cfg, self.stage
        head, body = plan.encode()
        link.send(head, cfg.successor, BATCH)
        link.send(body, cfg.successor, STEP)
        h_chunk, logits = None, None
        if plan.feed:
            h = _as(stage(mx.array(plan.feed)[:, None], state.batch), self._dtype)
            link.compute(h)
            link.send(h, cfg.successor, STEP)
        if plan.chunk >= 0:
            seq = state.pending[plan.chunk]
            at = len(seq.tokens)
            h_chunk = _as(stage(mx.array(seq.prompt[at:at + plan.chunk_len])[None],
                                seq.cache), self._dtype)
            link.compute(h_chunk)  # while the next rank runs the decode batch
        if plan.feed:
            link.expect(TOKEN)
            out = link.recv((len(plan.feed), 1, self.hidden), self._dtype, cfg.predecessor)
            logits = stage.logits(out)[:, -1, :]
            link.compute(logits)
        if h_chunk is not None:
            link.send(h_chunk, cfg.successor, STEP)
        link.stats.steps += 1
        return logits

    def receive(self) -> Plan:
        """A follower's next plan, passed on to the successor."""
        import mlx.core as mx

        link, cfg = self.link, self.link.cfg
        head = link.recv((HEAD_LEN,), mx.int32, cfg.predecessor)
        link.expect(STEP)
        hl = [int(x) for x in head.tolist()]
        body = link.recv((Plan.body_len(hl),), mx.int32, cfg.predecessor)
        if not self.stage.last:
            link.send(head, cfg.successor, BATCH)
            link.send(body, cfg.successor, STEP)
        plan = Plan.decode(hl, [int(x) for x in body.tolist()])
        self.stage.set_dtype(plan.dtype)
        return plan

    def run(self, plan: Plan, state: State) -> None:
        """A follower's part of the step: its layers over the decode batch and the chunk."""
        import mlx.core as mx

        link, cfg, stage = self.link, self.link.cfg, self.stage
        src, dst = cfg.predecessor, cfg.successor
        dtype = getattr(mx, plan.dtype)
        if plan.feed:
            link.expect(STEP)
            h = _as(stage(link.recv((len(plan.feed), 1, plan.hidden), dtype, src),
                          state.batch), dtype)
            link.compute(h)
            link.send(h, dst, TOKEN if stage.last else STEP)
        if plan.chunk >= 0:
            seq = state.pending[plan.chunk]
            link.expect(STEP)
            h = _as(stage(link.recv((1, plan.chunk_len, plan.hidden), dtype, src),
                          seq.cache), dtype)
            if stage.last:
                assert seq.cache is not None
                link.compute([c.state for c in seq.cache[stage.start:stage.end]])
            else:
                link.compute(h)
                link.send(h, dst, STEP)
        link.stats.steps += 1


class TensorSteps:
    """Every rank runs each step together; the plan is shared with an all_sum to which
    the other ranks add zeros."""

    def __init__(self, model: Any, link: Link):
        from engine.runtime.tensor import head_is_sharded

        self.model, self.link = model, link
        self.hidden, self.dtype = 0, DTYPES[0]
        self.body = model if head_is_sharded(model) else getattr(model, "model", model)

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache
        return list(make_prompt_cache(self.model))

    def _run(self, plan: Plan, state: State, lead: bool) -> Any:
        import mlx.core as mx

        link, logits = self.link, None
        if plan.feed:
            x = mx.array(plan.feed)[:, None]
            if lead:
                logits = self.model(x, cache=state.batch)[:, -1, :]
                link.compute(logits, collective=True)
            else:
                link.compute(self.body(x, cache=state.batch), collective=True)
        if plan.chunk >= 0:
            seq = state.pending[plan.chunk]
            at = len(seq.tokens)
            assert seq.cache is not None
            self.model(mx.array(seq.prompt[at:at + plan.chunk_len])[None], cache=seq.cache)
            link.compute([c.state for c in seq.cache], collective=True)
        link.stats.steps += 1
        return logits

    def lead(self, plan: Plan, state: State) -> Any:
        link = self.link
        head, body = plan.encode()
        link.bell.ring(BATCH)
        link.all_sum(head)
        link.all_sum(body)
        return self._run(plan, state, lead=True)

    def receive(self) -> Plan:
        import mlx.core as mx

        link, cfg = self.link, self.link.cfg
        if cfg.rank != cfg.world - 1:
            link.bell.ring(BATCH)  # first, so the whole group enters the collective together
        hl = [int(x) for x in link.all_sum(mx.zeros((HEAD_LEN,), mx.int32)).tolist()]
        body = link.all_sum(mx.zeros((Plan.body_len(hl),), mx.int32))
        return Plan.decode(hl, [int(x) for x in body.tolist()])

    def run(self, plan: Plan, state: State) -> None:
        self._run(plan, state, lead=False)


def apply_plan(plan: Plan, state: State) -> None:
    """A follower's side of the plan's bookkeeping before the step's compute, in rank 0's
    order (GroupBatcher._plan): leavers, the prefix cache's count, joiners."""
    state.drop(plan)
    state.prefix.keep(plan.keep)
    for prompt, cached in zip(plan.admit, plan.cached):
        cache, n = state.prefix.fetch(prompt)
        if n != cached:
            raise OutOfStep(f"the prefix cache is out of step (rank 0 holds {cached} of the "
                            f"prompt's tokens, this rank {n})")
        state.admit(prompt, cache, cached)
    state.joined()


class OutOfStep(RuntimeError):
    pass


def serve_follower(steps: PipelineSteps | TensorSteps, link: Link,
                   prefix: PrefixCache) -> None:
    """Ranks 1…n-1: follow rank 0's plans until the group quits. Between rounds a rank
    sleeps on its doorbell unbounded; inside one every wait is bounded (Link.wait)."""
    import mlx.core as mx

    state = State(prefix, steps.make_cache)
    busy = False
    try:
        while True:
            op = link.wait(busy)
            if op == END:
                link.bell.ring(END)  # the last rank's END reaches rank 0: all are idle
                busy = False
                mx.clear_cache()
                link.end_request()
                continue
            if op != BATCH:
                link.fail(f"the group is out of step (expected a plan, got {op!r})")
            if not busy:
                link.new_request()
            busy = True
            plan = steps.receive()
            apply_plan(plan, state)
            steps.run(plan, state)
            state.fed(plan)
            state.joined()
    except OutOfStep as e:
        link.fail(str(e))


# --- rank 0's scheduler ----------------------------------------------------------------
class GroupBatcher(Streams):
    """Rank 0's generator for a group that serves several requests at once."""

    def __init__(self, steps: PipelineSteps | TensorSteps, tokenizer: Any,
                 prefix: PrefixCache, streams: int, on_fatal: Callable[[str], None],
                 chunker: Chunker | None = None):
        super().__init__()
        self.steps, self.link, self.streams = steps, steps.link, streams
        self.eos = set(int(t) for t in tokenizer.eos_token_ids)
        self.state = State(prefix, steps.make_cache)
        self.chunker = chunker or Chunker()
        self._on_fatal = on_fatal
        self._waiting: list[Job] = []
        self._gone: set[int] = set()
        self._uid = 0
        self._busy = False
        threading.Thread(target=self._run, name="group-batcher", daemon=True).start()

    def _run(self) -> None:
        import time

        try:
            while True:
                idle = self.state.idle and not self._waiting
                if idle and self._busy:  # every rank goes back to sleep on its doorbell
                    self._busy = False   # (inside a round their waits are bounded)
                    self.link.end_round()
                self._take(block=idle)
                if self.state.idle and not self._waiting:
                    continue
                if not self._busy:
                    self._busy = True
                    self.link.new_request()
                plan = self._plan()
                t = time.perf_counter()
                logits = self.steps.lead(plan, self.state)
                if plan.chunk >= 0:  # the step's time is what the other streams waited
                    self.chunker.took(plan.chunk_len, time.perf_counter() - t)
                self.state.fed(plan)
                if logits is not None:
                    self._sample(logits)
                self.state.joined()
        except Exception as e:  # the group's state is unknown now: take it down
            log.exception("batched generation failed on rank 0")
            self._on_fatal(f"Generation failed in the model's group: {e}")

    def _take(self, block: bool) -> None:
        import queue

        while True:
            try:
                kind, job = self._inbox.get(block=block, timeout=None)
            except queue.Empty:
                return
            block = False
            if kind == "add":
                self._waiting.append(job)
            elif job in self._waiting:
                self._waiting.remove(job)
            elif job.uid is not None:
                self._gone.add(job.uid)

    def _plan(self) -> Plan:
        """Decide this step, applying rank 0's side of it as it goes."""
        from engine.runtime.sampling import token_sampler

        st = self.state
        plan = Plan(hidden=self.steps.hidden, dtype=self.steps.dtype)
        plan.drop = [i for i, s in enumerate(st.decoding) if _uid(s) in self._gone]
        plan.cancel = [i for i, s in enumerate(st.pending) if _uid(s) in self._gone]
        self._forget([st.decoding[i] for i in plan.drop] + [st.pending[i] for i in plan.cancel])
        st.drop(plan)
        plan.keep = len(st.prefix)
        while self._waiting and len(st.pending) + len(st.decoding) < self.streams:
            job = self._waiting.pop(0)
            try:
                sample = token_sampler(job.sampling, job.tokenizer, job.prompt)
            except Exception as e:  # e.g. a grammar that can't be built
                job.out.put(e)
                continue
            cache, job.cached = st.prefix.fetch(job.prompt)
            job.uid, self._uid = self._uid, self._uid + 1
            self._jobs[job.uid] = job
            seq = st.admit(job.prompt, cache, job.cached)
            seq.job, seq.sample = job, sample
            plan.admit.append(job.prompt)
            plan.cached.append(job.cached)
        st.joined()  # prompts the prefix cache held all but the last token of
        plan.feed = [_next(s) for s in st.decoding]
        ready = [(s.left, i) for i, s in enumerate(st.pending) if s.left > 0]
        if ready:
            left, plan.chunk = min(ready)
            size = self.chunker.size()
            # a prompt two chunks from its end runs whole: a short request starts at once
            plan.chunk_len = left if left <= 2 * size else size
        return plan

    def _sample(self, logits: Any) -> None:
        st = self.state
        for i, seq in enumerate(st.decoding):
            job = seq.job
            assert job is not None and seq.sample is not None
            if job.uid in self._gone:
                continue
            try:
                token, lp = seq.sample(logits[i:i + 1])
            except Exception as e:  # this request's sampling failed (e.g. its grammar)
                job.out.put(e)
                self._gone.add(job.uid)  # type: ignore[arg-type]
                continue
            seq.generated += 1
            finish = "stop" if token in self.eos else \
                "length" if seq.generated >= job.sampling.max_tokens else None
            seq.next = token
            job.out.put((token, lp, finish))
            if finish is not None:
                self._gone.add(job.uid)  # type: ignore[arg-type]

    def _forget(self, seqs: list[Seq]) -> None:
        for s in seqs:
            uid = _uid(s)
            self._gone.discard(uid)
            self._jobs.pop(uid, None)


def _as(h: Any, dtype: Any) -> Any:
    """Hidden states travel between ranks in the group's dtype."""
    return h if h.dtype == dtype else h.astype(dtype)


def _uid(seq: Seq) -> int:
    return seq.job.uid if seq.job is not None and seq.job.uid is not None else -1


def _next(seq: Seq) -> int:
    """The token a decoding sequence feeds next: its prompt's last, then what it sampled."""
    return seq.prompt[-1] if seq.next is None else seq.next
