"""Rank 0's decisions for a batching group, apart from any compute or I/O, so they can be
stepped in a test beside a follower's state.

One step rule for every rank: rank 0 decides who leaves and applies it with
state.apply_leavers, decides who joins (looking the prompts up in the prefix cache)
and applies it with apply_admissions, then decides what the step feeds and which chunk
runs; a follower applies the same plan with apply_plan, i.e. the same two functions in
the same order. After the step's compute every rank runs apply_step. So nothing but the
Plan has to travel, and no comment has to keep two copies of the rules alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine.runtime.batching import Job, Prefilled
from engine.runtime.chunking import SMALLEST, Chunker
from engine.runtime.group.adopt import Adoption
from engine.runtime.group.state import (
    Plan,
    Seq,
    State,
    apply_admissions,
    apply_adopt,
    apply_leavers,
    apply_trim,
)
from engine.runtime.speculative import Ask, batch_guesses

log = logging.getLogger(__name__)


class Scheduler:
    """What rank 0 knows beyond the shared State: the requests waiting for a turn, those
    that left (cancelled, finished, failed) and the number of streams it serves."""

    def __init__(self, state: State, streams: int, chunker: Chunker, hidden: int,
                 dtype: str, sampler: Callable[[Job], Any], drafting: Any = None,
                 admission: Any = None, stages: int = 1):
        self.state, self.streams, self.chunker = state, streams, chunker
        self.stages = stages  # pipeline stages a prompt's chunks flow through together
        # engine.runtime.drafting.Drafting, where the model's caches can be trimmed: the
        # decoding sequences feed drafted guesses with their tokens
        self.drafting = drafting
        self.trims: dict[int, list[int]] = {}  # lane -> per sequence, what to trim at its
                                               # next plan
        self.hidden, self.dtype = hidden, dtype
        self.sampler = sampler  # a job's token sampler (may raise: its request fails)
        self.waiting: list[Job] = []
        self.adopts: list[Adoption] = []  # other nodes' prefills to take in, one a plan
        self.gone: set[int] = set()  # uids whose sequences leave at their next plan
        self.jobs: dict[int, Job] = {}
        self._uid = 0
        self.admission = admission  # engine.runtime.admission.GroupAdmission, or None
        self._taken: dict[int, int] = {}  # uid -> the tokens of room it was admitted with
        self._full = False  # the first waiting request didn't fit: wait for a leaver

    def step(self, lane: int) -> Plan:
        """Decide `lane`'s next step, applying rank 0's side of it as it goes."""
        st = self.state
        seqs = st.lanes[lane].decoding
        plan = Plan(lane=lane, hidden=self.hidden, dtype=self.dtype,
                    trim=self.trims.pop(lane, []))
        apply_trim(plan, st)
        self._sweep()
        plan.drop = [i for i, s in enumerate(seqs) if uid(s) in self.gone]
        plan.cancel = [i for i, s in enumerate(st.pending) if uid(s) in self.gone]
        self._forget([seqs[i] for i in plan.drop] + [st.pending[i] for i in plan.cancel])
        apply_leavers(plan, st)
        plan.keep = len(st.prefix)
        if self.adopts:  # before anyone joins: the request that asked for it may be next
            adoption = self.adopts.pop(0)
            plan.adopt, plan.adopt_job = adoption.tokens, adoption.job
            adoption.answer(apply_adopt(plan, st))
        self._guard()
        joining, fetched = self._admit(plan)
        for (job, sample, embeds), seq in zip(joining, apply_admissions(plan, st, fetched)):
            seq.job, seq.sample = job, sample
            seq.embeds = embeds if seq.embedded else None
            if seq.placed is not None:  # the same positions, with rank 0's deepstack
                seq.placed = job.images.placed
        plan.feed = [next_token(s) for s in st.lanes[lane].decoding]
        self._draft(plan)
        ready = [(s.left, i) for i, s in enumerate(st.pending) if s.left > 0]
        # one chunk a round of the lanes, so each stream waits for one chunk at most
        if ready and st.first_busy_lane() in (lane, -1):
            left, plan.chunk = min(ready)
            alone = len(ready) == 1 and not self.waiting and not st.n_decoding
            size = self.chunker.size(alone)
            if alone and self.stages > 1:  # chunks enough to keep every stage busy: 8
                # a stage of the whole prompt (of what is left, the tail would shrink to
                # 16-token chunks that pay a step's fixed costs each)
                seq = st.pending[plan.chunk]
                whole = len(seq.prompt) - 1 - (seq.job.cached if seq.job else 0)
                size = min(size, max(SMALLEST, -(-whole // (8 * self.stages * SMALLEST))
                                     * SMALLEST))
            # a prompt two chunks from its end runs whole: a short request starts at once
            plan.chunk_len = left if left <= 2 * size else size
        return plan

    def _draft(self, plan: Plan) -> None:
        """Guesses for the lane's decoding sequences, while no prompt waits or prefills
        (a chunk's step is no measure of a pass): each drafts as many as the governor and
        its request allow; every sequence's row is padded to the widest."""
        st, d = self.state, self.drafting
        seqs = st.lanes[plan.lane].decoding
        if d is None or not seqs or st.pending or self.waiting:
            return
        # (an image request drafts nothing: its tokens hold image keys no model takes)
        asks = [Ask.of(s.job.sampling, s.job.sampling.max_tokens - s.generated - 1)
                if s.job is not None and uid(s) not in self.gone and s.job.images is None
                and d.wanted(s.job.sampling) else None for s in seqs]
        if not any(asks):
            return

        def propose(i: int, k: int) -> list[int]:
            seq = seqs[i]
            seq.drafter = seq.drafter or d.drafter()
            return list(seq.drafter.propose([*seq.tokens, plan.feed[i]], k))
        guesses = batch_guesses(d.governor_for(len(seqs)), asks, propose)
        width = max(len(g) for g in guesses)
        if width == 0:
            return
        for s, g in zip(seqs, guesses, strict=True):
            s.guesses = g
        plan.feed = [t for s, f in zip(seqs, plan.feed, strict=True)
                     for t in [f, *s.guesses, *[f] * (width - len(s.guesses))]]
        plan.guesses = width

    def _admit(self, plan: Plan) -> tuple[list[tuple[Job, Any, Any]], list[tuple[Any, int]]]:
        """The waiting requests that join now, with their samplers, their prompts' input
        embeddings (image requests) and prefix hits."""
        st = self.state
        joining: list[tuple[Job, Any, Any]] = []
        fetched: list[tuple[Any, int]] = []
        while self.waiting and not self._full \
                and len(st.pending) + len(joining) + st.n_decoding < self.streams:
            job = self.waiting.pop(0)
            if job.export >= 0 and plan.export >= 0:  # one export a plan
                self.waiting.insert(0, job)
                break
            try:
                sample = self.sampler(job)
            except Exception as e:  # e.g. a grammar that can't be built
                job.out.put(e)
                continue
            # an export is prefilled whole, from a fresh cache (group/export.py)
            cache, job.cached = (None, 0) if job.export >= 0 else st.prefix.fetch(job.key)
            need = self._room(job)
            if need is None:
                continue
            if need < 0:
                self.waiting.insert(0, job)
                break
            try:  # the vision tower runs here, before the plan goes out
                embeds = image_embeddings(job)
            except Exception as e:  # this request's images fail it, not the group
                log.warning("an image request's embeddings failed: %s", e)
                job.out.put(e)
                continue
            job.out.put(Prefilled(job.cached, job.cached))  # admitted: the cache hit is known
            job.uid, self._uid = self._uid, self._uid + 1
            self.jobs[job.uid] = job
            self._taken[job.uid] = need
            joining.append((job, sample, embeds))
            fetched.append((cache, job.cached))
            if job.export >= 0:
                plan.export, plan.export_job = len(plan.admit), job.export
            plan.admit.append(job.key)
            plan.cached.append(job.cached)
            placed = getattr(job.images, "placed", None)  # Qwen-VL: every rank rotates
            plan.places.append(placed.wire() if placed is not None else [])
        return joining, fetched

    def _guard(self) -> None:
        """Answers grow past the reserve they were admitted with: where together they
        outgrow the group's room, the longest ends at its next token ("length")."""
        from engine.runtime.admission import RESERVE

        adm = self.admission
        if adm is None:
            return
        seqs = [s for lane in self.state.lanes for s in lane.decoding
                if s.job is not None and s.job.uid in self._taken and not s.job.cut]
        grown = sum(max(0, s.generated - min(s.job.sampling.max_tokens, RESERVE))
                    for s in seqs if s.job is not None)
        if seqs and sum(self._taken.values()) + grown > adm.tokens:
            longest = max(seqs, key=lambda s: s.generated)
            assert longest.job is not None
            longest.job.cut = True
            log.warning("memory: the group's KV room (%d tokens) is full; the longest "
                        "answer (%d tokens) ends here", adm.tokens, longest.generated)

    def _room(self, job: Job) -> int | None:
        """The tokens of room `job` takes (0 without admission); -1: it waits for those in
        flight; None: it can never fit (its request failed with the reason)."""
        from engine.runtime.admission import NoRoom

        adm = self.admission
        if adm is None:
            return 0
        need = adm.need(len(job.prompt), job.cached, job.sampling.max_tokens)
        try:
            if adm.check(need, sum(self._taken.values()), len(self.jobs)):
                return need
        except NoRoom as e:
            job.out.put(e)
            return None
        self._full = True
        return -1

    def leave(self, job: Job) -> None:
        """A request's thread is done with it (cancelled, stopped on a stop string)."""
        if job in self.waiting:
            self.waiting.remove(job)
        elif job.uid in self.jobs:  # (_sweep may have let it go already)
            self.gone.add(job.uid)

    def _sweep(self) -> None:
        """Prompts whose clients left mid-prefill leave at this plan, before anyone joins:
        the node sends the cancel before a retry, so a retry sent at once finds the chunks
        they did (their own threads would say so only at their next poll)."""
        for s in self.state.pending:
            if s.job is not None and s.job.cancel is not None and s.job.cancel.is_set():
                self.gone.add(uid(s))

    def forget(self, seqs: list[Seq]) -> None:
        """Sequences that left outside a plan's drops (exports done, group/export.py)."""
        self._forget(seqs)

    def _forget(self, seqs: list[Seq]) -> None:
        for s in seqs:
            u = uid(s)
            self.gone.discard(u)
            self.jobs.pop(u, None)
            if self._taken.pop(u, None):
                self._full = False  # room came back: the first waiting may fit now


def uid(seq: Seq) -> int:
    return seq.job.uid if seq.job is not None and seq.job.uid is not None else -1


def next_token(seq: Seq) -> int:
    """The token a decoding sequence feeds next: its prompt's last, then what it sampled."""
    return seq.prompt[-1] if seq.next is None else seq.next


def image_embeddings(job: Job) -> Any:
    """An image request's prompt's input embeddings from its cache hit on (evaluated;
    None where no image token is left to run, or for a text request). The prompt's last
    token runs in the decode batch by its id, so it can't be an image's."""
    import mlx.core as mx

    from engine.errors import BadRequest

    if job.images is None:
        return None
    if job.key[-1] < 0:
        raise BadRequest("The prompt ends with an image; a group needs text after it "
                         "(the chat template's generation prompt).", param="messages")
    embeds = job.images.embeddings(job.cached)
    if embeds is not None:
        mx.eval(embeds)
    return embeds
