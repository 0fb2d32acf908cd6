"""What every rank of a batching group holds about the requests in flight, and the plan
rank 0 sends before each step (engine/runtime/group/batch.py runs the steps).

The decoding sequences sit in lanes: each lane's KV is one batched cache per layer
(mlx-lm's BatchKVCache and friends: merge, extend, filter, extract), and a step runs one
lane. A pipeline has a lane per rank, so while rank 1 runs one lane's step rank 0 runs the
next lane's; tensor groups have one lane. Each prefilling prompt has its own cache.

Every rank applies the plans in the order rank 0 sent them, so caches, lanes and prefix
tries stay alike: the rules below (which lane a prompt joins, which KV goes into the prefix
cache, a cancelled prompt's chunks among it) read only that shared state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.runtime.batching import Job
from engine.runtime.group.lockstep import DTYPES
from engine.runtime.prefix import PrefixCache
from engine.runtime.vision.positions import shifted

HEAD_LEN = 18


@dataclass
class Plan:
    """One step of the group, decided by rank 0."""

    lane: int = 0        # the lane whose sequences this step decodes
    drop: list[int] = field(default_factory=list)    # the lane's sequences that leave
    cancel: list[int] = field(default_factory=list)  # prefilling prompts that leave
    keep: int = 0        # prefix cache entries rank 0 holds after the drops
    admit: list[list[int]] = field(default_factory=list)  # prompts that join
    cached: list[int] = field(default_factory=list)  # their tokens the prefix cache holds
    feed: list[int] = field(default_factory=list)    # 1 + guesses tokens per sequence
    chunk: int = -1      # the prefilling prompt whose chunk runs (-1: none)
    chunk_len: int = 0
    hidden: int = 0
    dtype: str = DTYPES[0]
    guesses: int = 0     # drafted tokens: each of the lane's sequences feeds its token and
                         # this many guesses (padded where it has fewer)
    trim: list[int] = field(default_factory=list)  # per sequence of the lane: positions
                         # of its last step refused (and padding), trimmed before this one
    # per admitted prompt: its 3-D positions (Qwen-VL images: positions.Placed.wire), or []
    places: list[list[int]] = field(default_factory=list)
    # a prompt's KV another node prefilled, which every rank takes into its prefix cache
    # from its own node's copy of the frames (engine/runtime/group/adopt.py): its tokens
    # and the hand-over's number (-1: none)
    adopt: list[int] = field(default_factory=list)
    adopt_job: int = -1
    # the admitted prompt (its index) whose KV every rank writes out for another node
    # instead of decoding it (engine/runtime/group/export.py), and the hand-over's number
    export: int = -1
    export_job: int = -1

    @property
    def width(self) -> int:
        return 1 + self.guesses

    @property
    def empty(self) -> bool:
        """Nothing to run and nothing to tell the other ranks."""
        return not (self.drop or self.cancel or self.admit or self.feed or self.chunk >= 0
                    or any(self.trim) or self.adopt)

    def encode(self) -> tuple[Any, Any]:
        import mlx.core as mx

        ids = [t for p in self.admit for t in p]
        places = self.places or [[] for _ in self.admit]
        pos = [t for p in places for t in p]
        head = [self.lane, len(self.drop), len(self.cancel), self.keep, len(self.admit),
                len(ids), len(self.feed), self.chunk, self.chunk_len, self.hidden,
                DTYPES.index(self.dtype), self.guesses, len(self.trim), len(pos),
                len(self.adopt), self.adopt_job, self.export, self.export_job]
        body = [*self.drop, *self.cancel, *(len(p) for p in self.admit), *self.cached,
                *ids, *self.feed, *self.trim, *(len(p) for p in places), *pos,
                *self.adopt, 0]  # never empty
        return mx.array(head, dtype=mx.int32), mx.array(body, dtype=mx.int32)

    @staticmethod
    def body_len(head: list[int]) -> int:
        return head[1] + head[2] + 3 * head[4] + head[5] + head[6] + head[12] + head[13] \
            + head[14] + 1

    @classmethod
    def decode(cls, head: list[int], body: list[int]) -> Plan:
        lane, nd, nc, keep, na, nids, nf, chunk, chunk_len, hidden, dt, guesses, nt, npos, \
            nadopt, job, export, export_job = head
        at = 0

        def take(n: int) -> list[int]:
            nonlocal at
            at += n
            return body[at - n:at]

        drop, cancel, lens, cached, ids, feed, trim = (take(nd), take(nc), take(na),
                                                       take(na), take(nids), take(nf), take(nt))
        place_lens, pos = take(na), take(npos)
        places = _split(pos, place_lens) if npos else []  # (no prompt with positions)
        return cls(lane, drop, cancel, keep, _split(ids, lens), cached, feed, chunk,
                   chunk_len, hidden, DTYPES[dt], guesses, trim, places, take(nadopt), job,
                   export, export_job)


def _split(flat: list[int], lens: list[int]) -> list[list[int]]:
    out, at = [], 0
    for n in lens:
        out.append(flat[at:at + n])
        at += n
    return out


@dataclass
class Seq:
    prompt: list[int]
    tokens: list[int]          # exactly the tokens its KV holds (its prefix cache key)
    cache: list[Any] | None    # its own cache while it prefills
    job: Job | None = None    # rank 0 only
    sample: Callable[[Any], tuple[int, Any]] | None = None
    generated: int = 0
    next: int | None = None    # the token it feeds at its lane's next step
    guesses: list[int] = field(default_factory=list)  # rank 0: drafted for its step
    drafter: Any = None        # rank 0: its drafter (engine/runtime/speculative.py)
    cached: int = 0            # its prompt tokens the prefix cache gave it
    # an image's tokens are left to prefill (its prompt is keyed: those tokens' ids are
    # negative, from the image's hash): its chunks run from input embeddings
    embedded: bool = False
    embeds: Any = None         # rank 0: those embeddings, from `cached` on (vision/group.py)
    placed: Any = None         # Qwen-VL: its 3-D positions and delta (vision/positions.py)
    export: Any = None         # group/export.py's Exporter: its KV goes to another node

    @property
    def left(self) -> int:
        """Prompt tokens still to prefill (the last one runs in the decode batch)."""
        return len(self.prompt) - 1 - len(self.tokens)


@dataclass
class Lane:
    decoding: list[Seq] = field(default_factory=list)
    batch: list[Any] | None = None  # their KV, one batched cache per layer


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

    def __init__(self, prefix: PrefixCache, make_cache: Callable[[], list[Any]],
                 lanes: int = 1):
        self.prefix, self.make_cache = prefix, make_cache
        # (job, tokens) -> this rank's share of another node's prefill of `tokens`, read
        # from its node's copy of the frames (engine/runtime/group/adopt.py); or None
        self.adopter: Callable[[int, list[int]], list[Any]] | None = None
        # (job, tokens, cache) -> this rank's Exporter of a prompt's KV for another node
        self.exporter: Callable[[int, list[int], list[Any]], Any] | None = None
        self.exported: list[Seq] = []  # exports done at the last step (rank 0 answers)
        self.pending: list[Seq] = []
        self.lanes = [Lane() for _ in range(lanes)]

    @property
    def idle(self) -> bool:
        return not self.pending and not self.n_decoding

    @property
    def n_decoding(self) -> int:
        return sum(len(lane.decoding) for lane in self.lanes)

    def first_busy_lane(self) -> int:
        """The lowest lane with sequences decoding (-1: none)."""
        return next((i for i, lane in enumerate(self.lanes) if lane.decoding), -1)

    def drop(self, plan: Plan) -> None:
        """The plan's leavers go, decoding ones into the prefix cache."""
        lane = self.lanes[plan.lane]
        for i in plan.drop:
            assert lane.batch is not None
            self.prefix.finish(lane.decoding[i].tokens, _extract(lane.batch, i))
        if plan.drop:
            keep = [i for i in range(len(lane.decoding)) if i not in set(plan.drop)]
            lane.decoding = [lane.decoding[i] for i in keep]
            if keep:
                assert lane.batch is not None
                for c in lane.batch:
                    c.filter(keep)
            else:
                lane.batch = None
        gone = set(plan.cancel)
        for s in [s for i, s in enumerate(self.pending) if i in gone]:
            if s.export is not None:  # (its cache writes to a file: never kept)
                s.export.abort()
                continue
            # a prompt left mid-prefill: the chunks it did stay (this rank's layers of
            # them), so a retry starts where it stopped
            if s.cache is not None and len(s.tokens) > s.cached:
                self.prefix.partial(s.tokens, s.cache)
        self.pending = [s for i, s in enumerate(self.pending) if i not in gone]

    def admit(self, prompt: list[int], cache: list[Any] | None, cached: int,
              placed: Any = None) -> Seq:
        seq = Seq(prompt, list(prompt[:cached]), cache or self.make_cache(), cached=cached,
                  embedded=any(t < 0 for t in prompt[cached:]), placed=placed)
        self.pending.append(seq)
        return seq

    def joined(self) -> None:
        """Prompts with only their last token left join the lane with the fewest sequences
        (that token is the first they feed)."""
        for seq in [s for s in self.pending if s.left == 0]:
            self.pending.remove(seq)
            assert seq.cache is not None
            if seq.export is not None:  # written out for another node: it leaves here
                seq.export.finish(seq.cache)
                seq.cache = None
                self.exported.append(seq)
                continue
            self.prefix.snapshot(seq.prompt, seq.cache)
            # a Qwen-VL image request's rows rotate at offset + delta from here on
            delta = seq.placed.delta if seq.placed is not None else 0
            merged = [c.merge([c]) for c in shifted(seq.cache, delta)]
            lane = min(self.lanes, key=lambda ln: len(ln.decoding))
            if lane.batch is None:
                lane.batch = merged
            else:
                for a, b in zip(lane.batch, merged):
                    a.extend(b)
            seq.cache = seq.embeds = None
            lane.decoding.append(seq)

    def chunk(self, plan: Plan) -> tuple[Seq, list[int], Any]:
        """(the prefilling prompt whose chunk the plan runs, the chunk's ids as the prefix
        cache keys them, its input embeddings on rank 0 where it runs from them)."""
        seq = self.pending[plan.chunk]
        at = len(seq.tokens)
        keys = seq.prompt[at:at + plan.chunk_len]
        if seq.embeds is None:
            return seq, keys, None
        return seq, keys, seq.embeds[None, at - seq.cached:at - seq.cached + len(keys)]

    def fed(self, plan: Plan) -> None:
        w = plan.width  # each sequence fed its token and its (padded) guesses
        for i, seq in enumerate(self.lanes[plan.lane].decoding[:len(plan.feed) // w]):
            seq.tokens.extend(plan.feed[i * w:(i + 1) * w])
        if plan.chunk >= 0:
            seq = self.pending[plan.chunk]
            seq.tokens += seq.prompt[len(seq.tokens):len(seq.tokens) + plan.chunk_len]


def chunk_ids(keys: list[int]) -> Any:
    """A chunk's ids (1, n) as the model takes them: an image's key ids (negative; the
    chunk then runs from its input embeddings, so only their shape counts) as 0, so
    nothing indexes with them."""
    import mlx.core as mx
    return mx.array([max(0, t) for t in keys])[None]


class OutOfStep(RuntimeError):
    pass


def apply_trim(plan: Plan, state: State) -> None:
    """What each sequence refused at the lane's last step leaves its KV and its tokens,
    first, so a leaver's KV goes into the prefix cache exactly as its tokens say. A prompt
    that joined the lane since (at the end of it) trims nothing."""
    from engine.runtime.batch_drafts import take_back

    if not any(plan.trim):
        return
    lane = state.lanes[plan.lane]
    if len(plan.trim) > len(lane.decoding) or lane.batch is None:
        raise OutOfStep(f"trims for {len(plan.trim)} sequences of lane {plan.lane}, which "
                        f"holds {len(lane.decoding)}")
    trims = [*plan.trim, *[0] * (len(lane.decoding) - len(plan.trim))]
    take_back(lane.batch, trims)
    for seq, n in zip(lane.decoding, trims, strict=True):
        if n:
            del seq.tokens[-n:]


def apply_leavers(plan: Plan, state: State) -> None:
    """The plan's leavers go (decoding ones into the prefix cache); a follower then drops
    the prefix entries rank 0 dropped. Rank 0 runs this too, before it admits anyone."""
    state.drop(plan)
    if not state.prefix.leader:
        state.prefix.keep(plan.keep)


def apply_admissions(plan: Plan, state: State,
                     fetched: list[tuple[list[Any] | None, int]] | None = None) -> list[Seq]:
    """The plan's joiners start prefilling from the prefix cache's hit, and prompts with
    only their last token left join a lane. `fetched`: rank 0's own lookups, made while it
    decided (a follower looks up here and checks it finds what rank 0 found)."""
    seqs = []
    for i, (prompt, cached) in enumerate(zip(plan.admit, plan.cached)):
        if i == plan.export:  # prefilled whole, from a fresh cache
            cache, n = None, 0
        else:
            cache, n = fetched[i] if fetched is not None else state.prefix.fetch(prompt)
        if n != cached:
            raise OutOfStep(f"the prefix cache is out of step (rank 0 holds {cached} of the "
                            f"prompt's tokens, this rank {n})")
        seq = state.admit(prompt, cache, cached, _placed(plan, i, len(prompt)))
        if i == plan.export:
            if state.exporter is None:
                raise OutOfStep("this rank can't write a prompt's KV for another node")
            assert seq.cache is not None
            seq.export = state.exporter(plan.export_job, prompt[:-1], seq.cache)
        seqs.append(seq)
    state.joined()
    return seqs


def _placed(plan: Plan, i: int, n: int) -> Any:
    """The i-th admitted prompt's 3-D positions (positions.Placed), or None."""
    from engine.runtime.vision.positions import Placed

    wire = plan.places[i] if i < len(plan.places) else []
    if not wire:
        return None
    try:
        placed = Placed.unwire(wire)
    except ValueError as e:
        raise OutOfStep(str(e)) from None
    if placed.rows.shape[1] != n:
        raise OutOfStep(f"positions for {placed.rows.shape[1]} tokens, the prompt has {n}")
    return placed


def apply_adopt(plan: Plan, state: State) -> str | None:
    """The plan's handed-over KV into the prefix cache, on every rank at the same point
    (before anyone joins, past the budget: the request that asked for it comes next).
    Every rank reads the same bytes (its node checked its copy's hash) and checks them
    alike, so each keeps it or none does. None where it went in, else why not."""
    from engine.errors import ShoalError

    if not plan.adopt:
        return None
    if state.adopter is None:
        return "this group takes no KV from a prefill node"
    try:
        cache = state.adopter(plan.adopt_job, plan.adopt)
    except ShoalError as e:
        return e.message
    except (OSError, ValueError) as e:
        return str(e)
    state.prefix.hold(plan.adopt, cache)
    return None


def apply_plan(plan: Plan, state: State) -> list[Seq]:
    """Everything a plan changes before its step's compute, on any rank: leavers, an
    adopted prefill, then joiners (rank 0 decides between them and runs the same
    functions)."""
    apply_trim(plan, state)
    apply_leavers(plan, state)
    apply_adopt(plan, state)
    return apply_admissions(plan, state)


def apply_step(plan: Plan, state: State) -> None:
    """After the step's compute, on any rank: the tokens fed are in the caches, and a
    prompt whose chunk finished it joins a lane."""
    state.fed(plan)
    state.joined()
