"""One step rule for a batching group: rank 0's Scheduler decides each Plan and applies it
with the functions every follower runs. Here a leader's and a follower's State are
stepped side by side in one process (fake KV caches that hold the tokens they were fed,
scripted arrivals, cancels and finishes, over one lane and three), the plan crossing
between them as the ranks' wire carries it; after every step the two must be equal. And
a Plan survives its int32 codec, whatever it holds."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.runtime.batching import Job
from engine.runtime.chunking import Chunker
from engine.runtime.group.lockstep import DTYPES
from engine.runtime.group.schedule import Scheduler
from engine.runtime.group.state import Plan, State, apply_plan, apply_step
from engine.runtime.prefix import PrefixCache
from engine.runtime.sampling import Sampling


class FakeKV:
    """A layer cache that holds, per row, the tokens it was fed (what the real KV is of)."""

    def __init__(self, rows: list[list[int]] | None = None):
        self.rows = rows if rows is not None else [[]]

    @property
    def offset(self) -> int:
        return len(self.rows[0]) if len(self.rows) == 1 else 0

    @property
    def nbytes(self) -> int:
        return 8 * sum(len(r) for r in self.rows)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        self.rows = [r[:len(r) - n] for r in self.rows]
        return n

    keys, state = True, ()  # as engine/runtime/batch_drafts.take_back reads a batch's layer

    def prepare(self, right_padding: list[int]) -> None:
        self._drop = right_padding

    def finalize(self) -> None:  # a row's last positions go (BatchKVCache rolls them out)
        self.rows = [r[:len(r) - n] for r, n in zip(self.rows, self._drop, strict=True)]

    def feed(self, tokens: list[int], row: int = 0) -> None:
        self.rows[row] += tokens

    def merge(self, caches: list[FakeKV]) -> FakeKV:
        return FakeKV([list(c.rows[0]) for c in caches])

    def extend(self, other: FakeKV) -> None:
        self.rows += [list(r) for r in other.rows]

    def filter(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]

    def extract(self, i: int) -> FakeKV:
        return FakeKV([list(self.rows[i])])


LAYERS = 2


def make_cache() -> list[FakeKV]:
    return [FakeKV() for _ in range(LAYERS)]


def compute(plan: Plan, state: State) -> None:
    """What a step's forward pass does to the caches: the fed tokens and the chunk in."""
    lane, w = state.lanes[plan.lane], plan.width
    for row in range(len(plan.feed) // w):  # each sequence: its token and its guesses
        for c in lane.batch or []:
            c.feed(plan.feed[row * w:(row + 1) * w], row)
    if plan.chunk >= 0:
        seq = state.pending[plan.chunk]
        at = len(seq.tokens)
        for c in seq.cache or []:
            c.feed(seq.prompt[at:at + plan.chunk_len])


def wire(plan: Plan) -> Plan:
    """The plan as a follower receives it."""
    head, body = plan.encode()
    return Plan.decode([int(x) for x in head.tolist()], [int(x) for x in body.tolist()])


def view(state: State) -> dict:
    """Everything a step's rules read, as plain values."""
    return {
        "pending": [(s.prompt, s.tokens, [c.rows for c in s.cache or []])
                    for s in state.pending],
        "lanes": [([(s.prompt, s.tokens) for s in ln.decoding],
                   [c.rows for c in ln.batch or []]) for ln in state.lanes],
        "prefix": [list(t) for lru in state.prefix.lru._lru._lrus.values() for _, t in lru]}


class Drafts:
    """Drafting as the scheduler sees it: guesses of random lengths (prompt lookup would
    find some; here any will do, the sampling below keeps a random share)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def governor_for(self, size: int) -> Drafts:
        return self

    def drafter(self) -> Drafts:
        return self

    def propose(self, context: list[int], k: int) -> list[int]:
        return [self.rng.randrange(5, 200) for _ in range(k)]

    def wanted(self, sampling: Sampling) -> bool:
        return True

    def length(self, limit: int, cap: int | None = None, force: bool = False) -> int:
        return max(0, min(limit, self.rng.randrange(0, 5)))

    def width(self, lengths: list[int]) -> int:
        return max(lengths)


def run_script(seed: int, lanes: int, steps: int = 120, drafts: bool = False,
               arrivals: float = 0.3) -> int:
    rng = random.Random(seed)
    leader = State(PrefixCache(600, max_entries=6, leader=True), make_cache, lanes)
    follower = State(PrefixCache(600, max_entries=6, leader=False), make_cache, lanes)
    sched = Scheduler(leader, streams=4, chunker=Chunker(first=16), hidden=0,
                      dtype=DTYPES[0], sampler=lambda job: None,
                      drafting=Drafts(rng) if drafts else None)
    drafted = 0
    common = [rng.randrange(5, 200) for _ in range(40)]  # prompts share prefixes
    jobs: list[Job] = []
    planned = 0
    for step in range(steps):
        if rng.random() < arrivals:  # an arrival, often continuing an earlier conversation
            base = rng.choice([j.prompt for j in jobs] or [common])
            prompt = base[:rng.randrange(2, len(base) + 1)] + \
                [rng.randrange(5, 200) for _ in range(rng.randrange(1, 60))]
            job = Job(prompt, Sampling(max_tokens=rng.randrange(1, 12)), None)
            jobs.append(job)
            sched.waiting.append(job)
        if jobs and rng.random() < 0.05:  # a client leaves
            sched.leave(rng.choice(jobs))
        plan = sched.step(step % lanes)
        if plan.empty:
            continue
        planned += 1
        got = wire(plan)
        apply_plan(got, follower)
        decoding = list(leader.lanes[plan.lane].decoding)
        compute(plan, leader)
        compute(got, follower)
        apply_step(plan, leader)
        apply_step(got, follower)
        if plan.guesses:  # rank 0 keeps some of each sequence's guesses; the rest, and
            drafted += 1  # the padding, go at the lane's next plan
            trims = []
            for seq in decoding:
                kept = rng.randrange(0, len(seq.guesses) + 1)
                trims.append(plan.guesses - kept)
                seq.generated += kept
            if any(trims):
                sched.trims[plan.lane] = trims
        for seq in decoding:  # rank 0 samples: a token each, some requests finish
            seq.guesses = []
            seq.next = rng.randrange(5, 200)
            seq.generated += 1
            assert seq.job is not None
            if seq.generated >= seq.job.sampling.max_tokens or rng.random() < 0.05:
                sched.gone.add(seq.job.uid)  # type: ignore[arg-type]
        assert view(leader) == view(follower), f"step {step}"
    assert not drafts or drafted > 5  # the script did draft
    return planned


def test_a_leader_and_a_follower_stay_alike_one_lane():
    assert run_script(seed=1, lanes=1) > 60


def test_a_leader_and_a_follower_stay_alike_three_lanes():
    for seed in range(4):
        assert run_script(seed=seed, lanes=3) > 40


def test_a_leader_and_a_follower_stay_alike_with_drafts_and_trims():
    """The decoding sequences feed guesses, each its own number, padded to the widest;
    what each refused is trimmed from its KV and its tokens on both sides at the lane's
    next plan, before anyone leaves or joins."""
    for seed, lanes in ((1, 1), (2, 1), (3, 3), (4, 2)):  # arrivals rarer: drafts run
        assert run_script(seed=seed, lanes=lanes, steps=300, drafts=True,
                          arrivals=0.08) > 60


ints = st.lists(st.integers(0, 2**31 - 1), max_size=6)


@settings(max_examples=150, deadline=None)
@given(lane=st.integers(0, 7), drop=ints, cancel=ints, keep=st.integers(0, 2**31 - 1),
       admit=st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=20),
                      max_size=4),
       feed=ints, chunk=st.integers(-1, 7), chunk_len=st.integers(0, 2**31 - 1),
       hidden=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       guesses=st.integers(0, 16), trim=ints)
def test_a_plan_survives_its_codec(lane, drop, cancel, keep, admit, feed, chunk, chunk_len,
                                   hidden, dtype, guesses, trim):
    cached = [len(p) // 2 for p in admit]
    plan = Plan(lane, drop, cancel, keep, admit, cached, feed, chunk, chunk_len, hidden,
                dtype, guesses, trim)
    assert wire(plan) == plan


def test_a_prompt_alone_takes_large_chunks_yet_enough_to_keep_a_pipeline_busy():
    """Alone, a prompt's chunks are about a second long (1,000 tokens at 1,000 tokens/s);
    on a 3-stage pipeline they are cut so at least 24 flow through it; once another
    request waits, chunks go back to about 0.1 s."""
    def first_chunks(stages: int) -> tuple[int, int]:
        leader = State(PrefixCache(0, leader=True), make_cache, 1)
        chunker = Chunker()
        chunker.took(1000, 1.0)
        sched = Scheduler(leader, streams=4, chunker=chunker, hidden=0, dtype=DTYPES[0],
                          sampler=lambda job: None, stages=stages)
        sched.waiting.append(Job(list(range(5, 3005)), Sampling(max_tokens=4), None))
        alone = sched.step(0)
        apply_step(alone, leader)
        sched.waiting.append(Job(list(range(9, 3009)), Sampling(max_tokens=4), None))
        return alone.chunk_len, sched.step(0).chunk_len

    assert first_chunks(1) == (992, 96)
    assert first_chunks(3) == (128, 96)  # 2,999 tokens / 24 chunks, in 16s


def test_a_prompt_alone_on_a_pipeline_keeps_its_chunk_size_to_the_end():
    """The chunks of a lone prompt are an eighth of a stage's share of the whole prompt,
    to its last: cut from what is left, its tail shrank to 16-token chunks, each paying
    a step's fixed costs (a 900-token prompt took 35 steps on 2 stages, not 15)."""
    leader = State(PrefixCache(0, leader=True), make_cache, 1)
    chunker = Chunker()
    chunker.took(1000, 1.0)
    sched = Scheduler(leader, streams=4, chunker=chunker, hidden=0, dtype=DTYPES[0],
                      sampler=lambda job: None, stages=2)
    sched.waiting.append(Job(list(range(5, 906)), Sampling(max_tokens=4), None))
    sizes = []
    for _ in range(40):
        plan = sched.step(0)
        if plan.chunk < 0:
            break
        sizes.append(plan.chunk_len)
        apply_step(plan, leader)
    assert sum(sizes) == 900  # the last prompt token runs in the decode batch
    assert set(sizes[:-1]) == {64} and 64 <= sizes[-1] <= 128  # 900 / 16 chunks, in 16s
