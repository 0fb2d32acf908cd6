"""Continuous batching across the ranks of a group (pipeline or tensor parallel).

Rank 0 schedules as engine/runtime/batching.py does on one node: the requests in flight
decode together, and prompts are prefilled one time-sized chunk at a time between decode
steps, the shortest remaining first, so a short request never waits behind a long prompt
for more than a chunk. Before each step rank 0 sends a `Plan` (engine/runtime/group/state.py)
that every rank applies in the same order.

A pipeline keeps every stage busy: the decoding sequences are split into one lane per rank,
and while rank 1 runs one lane's step rank 0 already runs the next lane's (and the last
rank the one before). The sends are blocking and, over RDMA, wait for the receiver, so the
order is chosen to never close a circle of waits:
- what travels is a series of items (a plan with its decode batch, or a prompt's chunk);
  every rank but rank 0 receives an item whole before it passes anything of it on, so
  ranks 1…n-1 hold one item each at most;
- an item with a decode batch leaves the ring only when rank 0 takes its output back, so
  before rank 0 sends item i it takes the outputs of items i-(n-1) and older.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.runtime.batching import Job, Prefilled, Streams
from engine.runtime.chunking import Chunker
from engine.runtime.group.adopt import ADOPT_WAIT_S, Adoption
from engine.runtime.group.doorbell import BATCH, END, STEP, TOKEN
from engine.runtime.group.lockstep import DTYPES, Link
from engine.runtime.group.schedule import Scheduler
from engine.runtime.group.state import (
    HEAD_LEN,
    OutOfStep,
    Plan,
    Seq,
    State,
    apply_plan,
    apply_step,
    chunk_ids,
)
from engine.runtime.prefix import PrefixCache

log = logging.getLogger(__name__)

Outputs = list[tuple[list[Seq], Any]]  # a lane's sequences and their logits (B, vocab)
EXPORTED = "exported"  # on an export's queue: rank 0's part of it is written


# --- the compute of one step, per strategy --------------------------------------------
@dataclass
class Flight:
    item: int          # the item whose decode output rank 0 has yet to take back
    lane: int
    seqs: list[Seq]    # the lane's sequences, in the output's row order
    width: int = 1     # positions per sequence: 1 + guesses for a drafted step


def _placing(placing: Any, placed: Any) -> Any:
    """Around a prompt's chunk: Qwen-VL's attention rotates it at its 3-D positions
    (engine/runtime/vision/positions.py); nothing for other prompts and families."""
    from contextlib import nullcontext

    if placing is None or placed is None:
        return nullcontext()
    return placing.running(placed)


def _feed(plan: Plan) -> Any:
    """A step's input ids (B, 1 + guesses): each sequence's token and its guesses."""
    import mlx.core as mx
    return mx.array(plan.feed).reshape(-1, plan.width)


class PipelineSteps:
    """Rank 0's part of a pipeline step (settle, lead), and a follower's (receive, run)."""

    def __init__(self, stage: Any, link: Link):
        import mlx.core as mx

        self.stage, self.link = stage, link
        self.hidden, self.dtype = stage.hidden, stage.dtype
        self._dtype = getattr(mx, stage.dtype)
        self.lanes = link.cfg.lanes  # 1: one batch, stage after stage
        self._items = 0                        # items rank 0 has sent
        self._flights: deque[Flight] = deque()
        self._outs: list[tuple[list[Seq], Any]] = []  # hidden states taken back
        self._plan_msgs: tuple[Any, Any] | None = None
        self.placing: Any = None  # positions.Placing where the family places in 3-D

    def make_cache(self) -> list[Any]:
        return list(self.stage.make_cache())

    # rank 0
    def settle(self, lane: int) -> Outputs:
        """Take back the lane's step in flight (and any before it), so it can be planned."""
        while any(f.lane == lane for f in self._flights):
            self._take()
        return self._heads()

    def lead(self, plan: Plan, state: State) -> Outputs:
        """Send the plan and run rank 0's layers; the outputs taken back meanwhile."""

        link, stage = self.link, self.stage
        lane = state.lanes[plan.lane]
        head, body = plan.encode()
        item = [(head, BATCH), (body, STEP)]
        if plan.feed:
            h = _as(stage(_feed(plan), lane.batch), self._dtype)
            link.compute(h)
            item.append((h, STEP))
            link.stats.overlapped += bool(self._flights)
        self._send(item)
        if plan.feed:
            self._flights.append(Flight(self._items - 1, plan.lane, list(lane.decoding),
                                        plan.width))
        if plan.chunk >= 0:  # while the next ranks run the decode batch
            seq, keys, embeds = state.chunk(plan)
            with _placing(self.placing, seq.placed):
                h = _as(stage(chunk_ids(keys), seq.cache, embeds), self._dtype)
            link.compute(h)
            self._send([(h, STEP)])
        link.stats.steps += 1
        return self._heads()

    def _send(self, item: list[tuple[Any, bytes]]) -> None:
        # Ranks 1…n-1 hold an item each; room for this one comes only once the output of
        # item i-(n-1) is off the last rank, i.e. taken back by rank 0.
        world = self.link.cfg.world
        while self._flights and self._flights[0].item <= self._items - (world - 1):
            self._take()
        for x, op in item:
            self.link.send(x, self.link.cfg.successor, op)
        self._items += 1

    def _take(self) -> None:
        link, f = self.link, self._flights.popleft()
        link.expect(TOKEN)
        out = link.recv((len(f.seqs), f.width, self.hidden), self._dtype,
                        link.cfg.predecessor)
        self._outs.append((f.seqs, out))

    def _heads(self) -> Outputs:
        done = []
        for seqs, out in self._outs:
            logits = self.stage.logits(out)
            logits = logits if logits.shape[1] > 1 else logits[:, -1, :]
            self.link.compute(logits)
            done.append((seqs, logits))
        self._outs = []
        return done

    # ranks 1…n-1
    def receive(self) -> Plan:
        """A follower's next plan (passed on with the decode batch, once that is here)."""
        import mlx.core as mx

        link, cfg = self.link, self.link.cfg
        head = link.recv((HEAD_LEN,), mx.int32, cfg.predecessor)
        link.expect(STEP)
        hl = [int(x) for x in head.tolist()]
        body = link.recv((Plan.body_len(hl),), mx.int32, cfg.predecessor)
        self._plan_msgs = (head, body)
        plan = Plan.decode(hl, [int(x) for x in body.tolist()])
        self.stage.set_dtype(plan.dtype)
        return plan

    def run(self, plan: Plan, state: State) -> None:
        """A follower's part of the step: its layers over the lane's batch and the chunk.
        Each item is here whole before any of it goes on (see the module's docstring)."""
        import mlx.core as mx

        link, cfg, stage = self.link, self.link.cfg, self.stage
        src, dst = cfg.predecessor, cfg.successor
        dtype = getattr(mx, plan.dtype)
        assert self._plan_msgs is not None
        head, body = self._plan_msgs
        item = [] if stage.last else [(head, BATCH), (body, STEP)]
        if plan.feed:
            link.expect(STEP)
            shape = (len(plan.feed) // plan.width, plan.width, plan.hidden)
            h = _as(stage(link.recv(shape, dtype, src), state.lanes[plan.lane].batch), dtype)
            link.compute(h)
            item.append((h, TOKEN if stage.last else STEP))
        for x, op in item:
            link.send(x, dst, op)
        if plan.chunk >= 0:
            seq = state.pending[plan.chunk]
            link.expect(STEP)
            x = link.recv((1, plan.chunk_len, plan.hidden), dtype, src)
            with _placing(self.placing, seq.placed):
                h = _as(stage(x, seq.cache), dtype)
            if stage.last:
                assert seq.cache is not None
                link.compute([c.state for c in seq.cache[stage.start:stage.end]])
            else:
                link.compute(h)
                link.send(h, dst, STEP)
        link.stats.steps += 1


class TensorSteps:
    """Every rank runs each step together; the plan is shared with an all_sum to which
    the other ranks add zeros. One lane: nothing is ever in flight between steps."""

    lanes = 1

    def __init__(self, model: Any, link: Link, kv: Any = None):
        from engine.runtime.group.tensor import body
        from engine.runtime.quant_kv import KV

        self.model, self.link = model, link
        self.kv = kv if kv is not None else KV()  # quantized KV or not (quant_kv.py)
        self.hidden, self.dtype = 0, DTYPES[0]
        self._embed: tuple[int, Any] | None = None  # (hidden, dtype) of image embeddings
        self.placing: Any = None  # positions.Placing where the family places in 3-D
        self.body = body(model)

    def make_cache(self) -> list[Any]:
        return list(self.kv.make(self.model))

    def _run(self, plan: Plan, state: State, lead: bool) -> Outputs:
        import mlx.core as mx

        link, lane, done = self.link, state.lanes[plan.lane], []
        if plan.feed:
            x = _feed(plan)
            if lead:
                logits = self.model(x, cache=lane.batch)
                logits = logits if plan.guesses else logits[:, -1, :]
                link.compute(logits, collective=True)
                done.append((list(lane.decoding), logits))
            else:
                link.compute(self.body(x, cache=lane.batch), collective=True)
        if plan.chunk >= 0:
            seq, keys, embeds = state.chunk(plan)
            assert seq.cache is not None
            placed = seq.placed
            if seq.embedded:  # rank 0's image embeddings, to every rank
                embeds = self._share(embeds, len(keys))
                placed = self._deepstack(seq, keys)
            with _placing(self.placing, placed):
                if seq.embedded:
                    self.model(chunk_ids(keys), cache=seq.cache, input_embeddings=embeds)
                else:
                    self.model(mx.array(keys)[None], cache=seq.cache)
            link.compute([c.state for c in seq.cache], collective=True)
        link.stats.steps += 1
        return done

    def _share(self, embeds: Any, n: int) -> Any:
        """A chunk's input embeddings on every rank: rank 0's (1, n, hidden), zeros
        elsewhere, summed."""
        import mlx.core as mx

        from engine.runtime.vision.group import embed_shape

        if self._embed is None:
            self._embed = embed_shape(self.model)
        hidden, dtype = self._embed
        x = embeds.astype(dtype) if embeds is not None else mx.zeros((1, n, hidden), dtype)
        if x.shape != (1, n, hidden):
            raise OutOfStep(f"image embeddings of shape {x.shape}, not {(1, n, hidden)}")
        return self.link.all_sum(x)

    def _deepstack(self, seq: Seq, keys: list[int]) -> Any:
        """The chunk's Placed with rank 0's deepstack features for its image tokens, on
        every rank (Qwen3-VL: engine/runtime/vision/group.py)."""
        from engine.runtime.vision.group import embed_shape, share_deepstack

        if seq.placed is None or self.placing is None or not self.placing.deep:
            return seq.placed
        if self._embed is None:
            self._embed = embed_shape(self.model)
        try:
            return share_deepstack(seq.placed, self.placing.deep, len(seq.tokens), keys,
                                   self._embed, self.link.all_sum)
        except ValueError as e:
            raise OutOfStep(str(e)) from None

    def settle(self, lane: int) -> Outputs:
        return []

    def lead(self, plan: Plan, state: State) -> Outputs:
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


def serve_follower(steps: PipelineSteps | TensorSteps, link: Link,
                   prefix: PrefixCache, adopter: Any = None, exporter: Any = None) -> None:
    """Ranks 1…n-1: follow rank 0's plans until the group quits. Between rounds a rank
    sleeps on its doorbell unbounded; inside one every wait is bounded (Link.wait)."""
    import mlx.core as mx

    state = State(prefix, steps.make_cache, steps.lanes)
    state.adopter = adopter  # other nodes' prefills (engine/runtime/group/adopt.py)
    state.exporter = exporter  # prefills for other nodes (group/export.py)
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
            if not 0 <= plan.lane < steps.lanes:
                raise OutOfStep(f"the plan names lane {plan.lane} of {steps.lanes}")
            apply_plan(plan, state)
            steps.run(plan, state)
            apply_step(plan, state)
            state.exported.clear()  # (rank 0 answers for them)
    except OutOfStep as e:
        link.fail(str(e))


# --- rank 0's scheduler ----------------------------------------------------------------
class GroupBatcher(Streams):
    """Rank 0's generator for a group that serves several requests at once: a thread that
    takes the requests' arrivals and departures, asks the Scheduler for each step's plan
    (engine/runtime/group/schedule.py), runs it and samples."""

    def __init__(self, steps: PipelineSteps | TensorSteps, tokenizer: Any,
                 prefix: PrefixCache, streams: int, on_fatal: Callable[[str], None],
                 chunker: Chunker | None = None, drafting: Any = None,
                 admission: Any = None, adopter: Any = None, exporter: Any = None):
        from engine.runtime.sampling import token_sampler

        super().__init__()
        self.steps, self.link, self.streams = steps, steps.link, streams
        self.eos = set(int(t) for t in tokenizer.eos_token_ids)
        self.tokenizer = tokenizer  # (an export's Job reads its stop tokens)
        self.state = State(prefix, steps.make_cache, steps.lanes)
        self.state.adopter = adopter  # other nodes' prefills (engine/runtime/group/adopt.py)
        self.state.exporter = exporter  # prefills for other nodes (group/export.py)
        self.chunker = chunker or Chunker()
        self.scheduler = Scheduler(
            self.state, streams, self.chunker, steps.hidden, steps.dtype,
            lambda job: token_sampler(job.sampling, job.tokenizer, job.prompt),
            drafting if drafting is not None and _trimmable(steps.make_cache()) else None,
            admission, steps.link.cfg.world if isinstance(steps, PipelineSteps) else 1)
        self._stamps: dict[int, float] = {}  # lane -> when its last drafting step was sampled
        self._jobs = self.scheduler.jobs  # Streams' count of requests in flight
        self._on_fatal = on_fatal
        self._lane = 0
        self._busy = False
        self._resting = threading.Event()  # every rank is back on its doorbell
        self._resting.set()
        threading.Thread(target=self._run, name="group-batcher", daemon=True).start()

    def _run(self) -> None:
        import time

        sched = self.scheduler
        try:
            while True:
                idle = self.state.idle and not sched.waiting and not sched.adopts
                if idle and self._busy:  # every rank goes back to sleep on its doorbell
                    self._busy = False   # (inside a round their waits are bounded)
                    self.link.end_round()
                if idle:
                    self._resting.set()
                self._take(block=idle)
                if self.state.idle and not sched.waiting and not sched.adopts:
                    continue
                if not self._busy:
                    self._busy = True
                    self._resting.clear()
                    self.link.new_request()
                # the lanes take turns; one in flight is taken back before it is planned
                lane, self._lane = self._lane, (self._lane + 1) % self.steps.lanes
                self._sample(self.steps.settle(lane))
                plan = sched.step(lane)
                if plan.empty:
                    continue
                if plan.chunk >= 0:  # the chunk's prompt, before the step moves it on
                    chunked = self.state.pending[plan.chunk]
                t = time.perf_counter()
                outputs = self.steps.lead(plan, self.state)
                if plan.chunk >= 0:  # the step's time is what the other streams waited
                    self.chunker.took(plan.chunk_len, time.perf_counter() - t)
                    _prefilled(chunked, plan.chunk_len)
                apply_step(plan, self.state)
                self._exported()
                self._sample(outputs)
        except Exception as e:  # the group's state is unknown now: take it down
            log.exception("batched generation failed on rank 0")
            self._on_fatal(f"Generation failed in the model's group: {e}")

    def export(self, tokens: list[int], job: int, cancel: threading.Event,
               progress: Callable[[int], None]) -> None:
        """Prefill `tokens` on every rank for another node, each rank writing its layers'
        KV as hand-over `job`'s frames (engine/runtime/group/export.py); returns once
        rank 0's part is written (the others' follow within their step). Raises what
        failed it; a cancel takes it out at the next plan."""
        import queue

        from engine.runtime.sampling import Sampling

        job_ = Job(list(tokens) + [0], Sampling(max_tokens=1), self.tokenizer,
                   cancel=cancel, export=job)
        self._inbox.put(("add", job_))
        try:
            while True:
                try:
                    item = job_.out.get(timeout=0.1)
                except queue.Empty:
                    continue
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Prefilled):
                    progress(item.done)
                elif item == EXPORTED:
                    return
        finally:
            self._inbox.put(("remove", job_))

    def _exported(self) -> None:
        """Exports done at this step: their requests hear so, and they leave."""
        for seq in self.state.exported:
            if seq.job is not None:
                seq.job.out.put(EXPORTED)
        self.scheduler.forget(self.state.exported)
        self.state.exported.clear()

    def adopt(self, tokens: list[int], job: int, timeout: float = ADOPT_WAIT_S) -> str | None:
        """Have every rank take hand-over `job`'s KV of `tokens` into its prefix cache, at
        the next plan (engine/runtime/group/adopt.py); None once done, else why not."""
        adoption = Adoption(list(tokens), job)
        self._inbox.put(("adopt", adoption))  # type: ignore[arg-type]
        if not adoption.done.wait(timeout):
            return f"the group didn't get to it in {timeout:.0f} s"
        return adoption.why

    def rest(self, timeout: float) -> bool:
        """Wait (bounded) until the round in progress has ended on every rank: a shutdown
        right after a request's last token must not quit the group under its last plan
        (the one that drops the finished request) or its END."""
        return self._resting.wait(timeout)

    def _take(self, block: bool) -> None:
        import queue

        while True:
            try:
                kind, job = self._inbox.get(block=block, timeout=None)
            except queue.Empty:
                return
            block = False
            if kind == "add":
                self.scheduler.waiting.append(job)
            elif kind == "adopt":
                self.scheduler.adopts.append(job)  # type: ignore[arg-type]  # (an Adoption)
            else:
                self.scheduler.leave(job)

    def _sample(self, outputs: Outputs) -> None:
        gone = self.scheduler.gone
        for seqs, logits in outputs:
            if self.scheduler.drafting is not None:
                self._verify(seqs, logits)
                continue
            for i, seq in enumerate(seqs):
                assert seq.job is not None
                if seq.job.uid not in gone:
                    self._emit(seq, logits[i:i + 1])

    def _emit(self, seq: Seq, row: Any) -> int | None:
        """Sample a sequence's next token from one row of logits and send it; None when
        that ended the request (its last token, or its sampling failed)."""
        job, gone = seq.job, self.scheduler.gone
        assert job is not None and seq.sample is not None
        try:
            token, lp = seq.sample(row)
        except Exception as e:  # this request's sampling failed (e.g. its grammar)
            job.out.put(e)
            gone.add(job.uid)  # type: ignore[arg-type]
            return None
        seq.generated += 1
        finish = "stop" if token in job.ends else \
            "length" if seq.generated >= job.sampling.max_tokens or job.cut else None
        seq.next = token
        job.out.put((token, lp, finish))
        if finish is not None:
            gone.add(job.uid)  # type: ignore[arg-type]
            return None
        return token

    def _verify(self, seqs: list[Seq], logits: Any) -> None:
        """A drafting group's step: per sequence, its token's logits then one row per
        guess (logits (B, width, vocab)), or one row each (B, vocab) where no sequence
        guessed. Draws go in order while they equal the guesses (the rule of
        engine/runtime/speculative.py); what each refused, and its padding, is trimmed on
        every rank at the lane's next plan."""
        import time

        sched = self.scheduler
        width = logits.shape[1] if logits.ndim == 3 else 1
        lane = next((i for i, ln in enumerate(self.state.lanes)
                     if any(s is seqs[0] for s in ln.decoding)), None)
        trims, rows = [], []
        for i, seq in enumerate(seqs):
            job, guesses = seq.job, seq.guesses
            assert job is not None and seq.sample is not None
            seq.guesses = []
            kept = 0
            if job.uid not in sched.gone:
                for p in range(len(guesses) + 1):
                    row = logits[i, p:p + 1] if width > 1 else logits[i:i + 1]
                    token = self._emit(seq, row)
                    if p < len(guesses) and seq.next == guesses[p]:
                        kept += 1  # (its KV is in; a last token that ends it counts too)
                    if token is None or p == len(guesses) or token != guesses[p]:
                        break
                job.drafted += len(guesses)
                job.accepted += kept
            trims.append(width - 1 - kept)
            rows.append((len(guesses), kept))
        if lane is None:
            return
        if any(trims):
            sched.trims[lane] = trims
        now, then = time.perf_counter(), self._stamps.pop(lane, None)
        if self.state.pending or sched.waiting:
            return  # a step beside a prompt's chunk is no measure of a pass
        if then is not None:
            sched.drafting.governor_for(len(seqs)).observed_rows(rows, width - 1, now - then)
        self._stamps[lane] = now


def _trimmable(cache: list[Any]) -> bool:
    """Refused guesses can be trimmed from every layer's cache (no sliding window's ring,
    no recurrent state): the model's caches as rank 0 makes them (all layers)."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache
    return bool(cache) and all(isinstance(c, (KVCache, QuantizedKVCache)) for c in cache)


def _prefilled(seq: Seq, n: int) -> None:
    """The request hears how far its prompt is (before apply_step counts the chunk in)."""
    if seq.job is not None:
        seq.job.out.put(Prefilled(seq.job.cached, len(seq.tokens) + n))


def _as(h: Any, dtype: Any) -> Any:
    """Hidden states travel between ranks in the group's dtype."""
    return h if h.dtype == dtype else h.astype(dtype)
