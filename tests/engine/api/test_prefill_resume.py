"""A retry resumes where the client gave up (issue 48, point 5): agents and SDKs time out
mid-prefill and send the same prompt again; the chunks the first attempt finished stay in
the prefix cache, so the retry starts where it stopped, and answers exactly as an
uninterrupted request does.

- every kind of cache (plain KV, linear-attention state, sliding windows), batched and one
  request at a time, in process: cut, retried, the same greedy answer as mlx-lm;
- a real node and real clients (the openai SDK with a timeout shorter than the prefill,
  an httpx stream read until half the prefill): the retry's cached_tokens cover the chunks
  done before it left, and its wait is a fraction of a cold one;
- a real group (two pipeline ranks on loopback, a slow test): every rank keeps its layers'
  share of the same entry, and the retry hits it.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nodes import NodeProcess, home_with  # noqa: E402
from tiny import LLAMA, make_tiny_model  # noqa: E402

WORDS = ("the quick brown fox jumps over the lazy dog ",
         "pack my box with five dozen liquor jugs now ",
         "how vexingly quick daft zebras jump at dawn ")
PROGRESS = ": shoal-progress "


def chat(words: str, n: int) -> list[dict]:
    return [{"role": "user", "content": words * n}]


def greedy(folder: Path, messages: list[dict], max_tokens: int) -> str:
    """What mlx-lm answers with a fresh cache, uninterrupted."""
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tok = load(str(folder))
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    return "".join(r.text for r in stream_generate(model, tok, ids, max_tokens=max_tokens,
                                                   sampler=make_sampler(temp=0.0)))


# --- in process: each kind of cache resumes to the same answer -------------------------
@pytest.fixture(scope="module")
def family_models(tmp_path_factory) -> dict[str, Path]:
    from families import make_family_model

    root = tmp_path_factory.mktemp("families")
    return {**{f: make_family_model(root / f, f, seed=3)
               for f in ("llama", "qwen3_next", "gpt_oss")},
            # heads 32 wide: quantized KV's groups fit them
            "llama-wide": make_tiny_model(root / "wide", LLAMA, seed=3, hidden_size=128,
                                          intermediate_size=128, num_hidden_layers=2)}


def _cut_then_retry(gen, model, tok, prompt, sampling, cut_at: int) -> tuple[int, list, list]:
    """(the prompt tokens done when the client left, the cut request's records, the
    retry's records)."""
    cancel, seen = threading.Event(), [0]

    def progress(cached: int, done: int, total: int) -> None:
        seen[0] = max(seen[0], done)
        if done >= cut_at:
            cancel.set()  # the client leaves here
    cut = list(gen(model, tok, prompt, sampling, cancel, progress=progress))
    return seen[0], cut, list(gen(model, tok, prompt, sampling, threading.Event()))


@pytest.mark.parametrize("family, bits", [("llama", None), ("llama-wide", 8), ("qwen3_next", None),
                                          ("gpt_oss", None)])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-at-a-time"])
def test_every_kind_of_cache_resumes_a_cut_prefill_to_the_same_answer(family_models, family,
                                                                      bits, batched):
    """Linear-attention state can't be rewound and a sliding window's ring can't be
    trimmed, but every cache resumes from a prefix of its prompt: the entry is kept as
    the cache stood when the client left. Quantized KV (8 bits) answers as the same path
    does uninterrupted (mlx-lm's answer is the 16-bit one)."""
    from mlx_lm import load

    from engine.runtime.batching import Batcher
    from engine.runtime.chunking import Chunker
    from engine.runtime.generate import generate
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.quant_kv import KV
    from engine.runtime.sampling import Sampling

    folder = family_models[family]
    model, tok = load(str(folder))
    messages = chat(WORDS[0], 50)  # ~2,200 tokens: past one 2048-token chunk
    prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True))
    sampling = Sampling(max_tokens=8, temperature=0.0)
    prefix = PrefixCache(100_000)
    if batched:  # 16-token chunks: the client leaves between two of them
        gen = Batcher(model, tok, prefix, 2, chunker=Chunker(first=16, alone_s=1e-6),
                      kv_bits=bits)
        cut_at = 1000
    else:
        def gen(*a, **kw):
            return generate(*a, prefix=prefix, kv=KV.for_model(model, bits), **kw)
        cut_at = 2048  # mlx-lm's chunk
    want = greedy(folder, messages, 8) if bits is None else \
        "".join(r.text for r in gen(model, tok, prompt, sampling, threading.Event()))
    prefix.lru.trim_to(n_sequences=0)  # (the uninterrupted answer's entry)
    seen, cut, retry = _cut_then_retry(gen, model, tok, prompt, sampling, cut_at)
    assert cut[-1].finish_reason == "cancelled" and cut[-1].generation_tokens == 0
    assert seen >= cut_at
    cached = retry[-1].cached_tokens
    assert seen <= cached < len(prompt), (seen, cached, len(prompt))
    assert "".join(r.text for r in retry) == want
    def kept() -> list[int]:
        return [len(t) for lru in prefix.lru._lru._lrus.values() for _, t in lru]
    # the batcher keeps a finished answer's KV on its own thread just after its last
    # record: on a loaded machine that can come a moment after the test reads it
    deadline = time.monotonic() + 10
    while cached in kept() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cached not in kept() and len(kept()) <= 2, "the finished prompt (and, for "\
        "recurrent state, its end's copy) replaced the cut one's entry: one a prompt, not "\
        "one a chunk"


def test_a_cut_prefill_with_drafts_on_resumes_too(family_models):
    """One request at a time with drafts (prompt lookup) prefills in its own loop: it
    keeps its finished chunks as well."""
    from mlx_lm import load

    from engine.runtime.drafting import Drafting, drafted_generate
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    folder = family_models["llama"]
    model, tok = load(str(folder))
    messages = chat(WORDS[1], 50)
    prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True))
    sampling = Sampling(max_tokens=8, temperature=0.0, speculative=True)
    prefix, drafting = PrefixCache(100_000), Drafting()

    def gen(*a, **kw):
        return drafted_generate(drafting, *a, prefix=prefix, **kw)
    seen, cut, retry = _cut_then_retry(gen, model, tok, prompt, sampling, 1024)
    assert cut[-1].finish_reason == "cancelled"
    assert seen <= retry[-1].cached_tokens < len(prompt), (seen, retry[-1].cached_tokens)
    assert "".join(r.text for r in retry) == greedy(folder, messages, 8)


def test_partial_entries_grow_one_per_prompt_and_give_way_to_the_finished_one():
    """Each retry that is cut again replaces the entry it extends; the finished prompt
    replaces them all, rewindable caches (mlx-lm drops prefixes) or not (Shoal does)."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, KVCache

    from engine.runtime.prefix import PrefixCache

    def kv(n: int) -> list:
        c = KVCache()
        c.update_and_fetch(mx.zeros((1, 2, n, 4)), mx.zeros((1, 2, n, 4)))
        return [c]

    def state(n: int) -> list:  # recurrent state: holds n tokens, can't be rewound
        c = ArraysCache(1)
        c[0] = mx.full((1, 4), float(n))
        return [c]

    prompt = list(range(10, 400))
    for make in (kv, state):
        p = PrefixCache(10_000)
        p.partial(prompt[:100], make(100))
        p.partial(prompt[:250], make(250))
        assert len(p) == 1 and p.tokens() == 250
        assert p.fetch(prompt)[1] == 250
        p.mark(prompt, make(len(prompt) - 1))
        p.finish(prompt + [7, 8], make(len(prompt) + 2))
        kept = sorted(len(t) for lru in p.lru._lru._lrus.values() for _, t in lru)
        assert kept == ([len(prompt) + 2] if make is kv else [len(prompt) - 1, len(prompt) + 2])
        other = [5, *prompt[1:300]]  # an unrelated prompt's partial stays
        p.partial(other[:200], make(200))
        assert p.fetch(other)[1] == 200


# --- a real node, real clients ----------------------------------------------------------
@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> Path:
    """Wide enough that a 4 K-token prompt takes seconds to prefill (as test_long_prefill)."""
    return make_tiny_model(tmp_path_factory.mktemp("slow") / "slow", LLAMA, hidden_size=128,
                           intermediate_size=512, num_hidden_layers=4,
                           max_position_embeddings=131072)


@pytest.fixture(scope="module")
def node(tmp_path_factory, slow_model):
    n = NodeProcess(home_with(tmp_path_factory.mktemp("resume"), slow_model), "slow")
    try:
        n.wait_healthy()
        n.wait_ready()
        yield n
    finally:
        n.stop()


def _timed(oai: openai.OpenAI, messages: list[dict]) -> tuple[float, str, int, int]:
    """(time to the first token, the answer, cached and prompt tokens) of a streamed,
    greedy request."""
    t0 = time.monotonic()
    first, text, usage = None, "", None
    for c in oai.chat.completions.create(model="slow", messages=messages, max_tokens=8,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True}):
        if c.choices and c.choices[0].delta.content and first is None:  # (not the
            first = time.monotonic() - t0                                # role's chunk)
        if c.choices:
            text += c.choices[0].delta.content or ""
        usage = c.usage or usage
    assert first is not None and usage is not None
    return first, text, usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens


def test_an_sdk_that_times_out_mid_prefill_then_retries_waits_only_for_the_rest(node,
                                                                               slow_model):
    oai = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0)
    _timed(oai, chat("warm ", 4))  # the chunker has measured the machine
    cold, _, cached0, n = _timed(oai, chat(WORDS[0], 90))  # ~4,000 tokens, nothing cached
    assert cached0 < 50, cached0  # (the chat template's first tokens)
    hurried = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0,
                            timeout=cold / 2)
    with pytest.raises(openai.APITimeoutError):
        hurried.chat.completions.create(model="slow", messages=chat(WORDS[1], 90),
                                        max_tokens=8, temperature=0)
    retry, text, cached, n2 = _timed(oai, chat(WORDS[1], 90))  # at once, as SDKs do
    assert n2 == n
    assert 0.25 * n <= cached < n, (cached, n)  # at least the half done before it left
    assert retry / cold < 0.85, f"retry {retry:.2f} s vs cold {cold:.2f} s"
    assert text == greedy(slow_model, chat(WORDS[1], 90), 8)


def test_a_stream_read_until_half_the_prefill_leaves_its_chunks_to_the_retry(node):
    """The chat window's progress comments say how far the prefill got before the client
    left; the retry's first one says what it reused, as its usage does."""
    body = {"model": "slow", "messages": chat(WORDS[2], 90), "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}}
    last = total = 0
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body,
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(PROGRESS):
                _, last, total = (int(x) for x in line[len(PROGRESS):].split())
                if last >= total // 2:
                    break  # the client gives up here
    assert 0 < last < total
    first = None
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body,
                      timeout=120) as r:
        usage = None
        for line in r.iter_lines():
            if line.startswith(PROGRESS) and first is None:
                first = int(line[len(PROGRESS):].split()[0])
            elif line.startswith("data: {") and '"usage"' in line:
                import json
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage is not None and first is not None
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached == first and last <= cached < total, (last, cached, total)


# --- a real group: two pipeline ranks on loopback ---------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")
def test_a_groups_ranks_keep_the_cut_prefill_alike_and_the_retry_resumes(tmp_path,
                                                                        slow_model):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from dist_harness import Group, collect, texts

    messages = chat(WORDS[1], 70)
    want = greedy(slow_model, messages, 6)
    group = Group(tmp_path / "g", slow_model, 2, "pipeline", [[0, 2], [2, 4]], streams=2,
                  prefix_cache_tokens=20_000)
    try:
        group.ready()
        leader = group.leader
        leader.send({"op": "generate", "id": "cut", "request": {
            "messages": messages, "sampling": {"max_tokens": 6, "temperature": 0}}})
        ev = leader.expect(lambda e: e.get("id") == "cut" and e["ev"] == "progress"
                           and e["done"] * 3 >= e["total"], 120)
        leader.send({"op": "cancel", "id": "cut"})
        cut = collect(leader, "cut")
        assert cut[-1]["ev"] == "done" and cut[-1]["finish_reason"] == "cancelled"
        assert cut[-1]["generation_tokens"] == 0, "it left mid-prefill"
        leader.send({"op": "generate", "id": "retry", "request": {
            "messages": messages, "sampling": {"max_tokens": 6, "temperature": 0}}})
        retry = collect(leader, "retry")
        assert retry[-1]["ev"] == "done", retry[-1]  # a rank out of step fails the group
        cached = retry[-1]["cached_tokens"]
        assert ev["done"] <= cached < retry[-1]["prompt_tokens"], (ev, cached)
        assert "".join(texts(retry)) == want
    finally:
        group.kill()


def test_a_groups_leader_and_follower_keep_the_same_cut_entry_and_both_hit_it():
    """The fast check of the group's rule (fake KV that holds the tokens it was fed, as
    tests/engine/runtime/test_group_schedule.py steps a leader beside a follower): the
    client's cancel is seen at rank 0's next plan, before the retry that came after it
    is admitted; both ranks keep the cut prompt's chunks and both find them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from test_group_schedule import compute, make_cache, view, wire

    from engine.runtime.batching import Job
    from engine.runtime.chunking import Chunker
    from engine.runtime.group.lockstep import DTYPES
    from engine.runtime.group.schedule import Scheduler
    from engine.runtime.group.state import State, apply_plan, apply_step
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    leader = State(PrefixCache(2000, leader=True), make_cache)
    follower = State(PrefixCache(2000, leader=False), make_cache)
    sched = Scheduler(leader, streams=4, chunker=Chunker(first=16, alone_s=1e-6), hidden=0,
                      dtype=DTYPES[0], sampler=lambda job: None)

    def step() -> None:
        plan = sched.step(0)
        got = wire(plan)
        apply_plan(got, follower)
        compute(plan, leader)
        compute(got, follower)
        apply_step(plan, leader)
        apply_step(got, follower)
        assert view(leader) == view(follower)

    prompt = list(range(5, 600))
    cut = Job(prompt, Sampling(max_tokens=4), None, cancel=threading.Event())
    sched.waiting.append(cut)
    for _ in range(10):  # ten 16-token chunks
        step()
    done = len(leader.pending[0].tokens)
    assert 16 * 5 <= done < len(prompt) - 1
    cut.cancel.set()  # the client leaves; its retry comes at once, before its thread says so
    retry = Job(prompt, Sampling(max_tokens=4), None, cancel=threading.Event())
    sched.waiting.append(retry)
    step()
    assert retry.cached == done and leader.pending[0].cached == done
    assert follower.pending[0].cached == done, "the follower took the same hit"
    sched.leave(cut)  # its thread says so late: nothing more happens
    step()
    assert len(leader.pending) == 1 and not sched.gone
