"""Admission in the one-process batcher: a request whose KV can't fit even alone is a 503
giving both figures (before anything is allocated), one that fits only once others are
done waits for them, and the prefix cache gives up entries before anyone waits.

The first test runs the real rule against a limit set just above what MLX holds now; the
others model a machine's memory with a `room` function (what is left = a budget less the
KV of what runs and of the prefix cache), since this machine's real free memory is far
too large to run out of and moves with whatever else runs."""

from __future__ import annotations

import threading

import pytest

from tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.runtime.load import load_model

    folder = make_tiny_model(tmp_path_factory.mktemp("adm") / "tiny-llama")
    model, tok, config = load_model(folder)
    return model, tok, config


def prompt_of(tok, n_words: int, word: str = "word") -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": f"{word} " * n_words}],
                                   add_generation_prompt=True)


def tokens(gen, model, tok, prompt, s):
    return [r.token for r in gen(model, tok, prompt, s) if r.token is not None]


def test_a_request_that_cant_fit_alone_is_a_503_with_the_figures(tiny):
    """The real rule: a limit 100 MB above what MLX holds now, and KV counted at 100 kB a
    token (this tiny model's real 0.5 kB would drown in the allocator's noise)."""
    import mlx.core as mx

    from engine.errors import ShoalError
    from engine.runtime.admission import Admission, kv_bytes_per_token
    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok, config = tiny
    assert kv_bytes_per_token(config, None) > 0  # the planner's figure for this model
    per = 100_000.0
    limit = int((mx.get_active_memory() + 100e6) / 0.95)  # room for ~1,000 tokens
    gen = Batcher(model, tok, PrefixCache(0), 4, admission=Admission(per, limit))
    s = Sampling(max_tokens=8)
    assert len(tokens(gen, model, tok, prompt_of(tok, 100), s)) == 8  # fits
    with pytest.raises(ShoalError) as e:
        tokens(gen, model, tok, prompt_of(tok, 3000), s)
    assert e.value.status == 503 and e.value.code == "insufficient_memory"
    assert "MB" in e.value.message and "max_tokens" in e.value.message
    assert len(tokens(gen, model, tok, prompt_of(tok, 100), s)) == 8  # still serving


class Memory:
    """What is left on a modelled machine: a budget less the KV of every request in the
    batch (prompt and reserve) and of the prefix cache's entries."""

    def __init__(self, budget_tokens: int, per: float):
        self.budget, self.per, self.gen = budget_tokens, per, None
        self.lowest = budget_tokens * per

    def __call__(self, limit):
        from engine.runtime.admission import RESERVE

        used = sum(len(j.prompt) + min(j.sampling.max_tokens, RESERVE)
                   for j in self.gen._jobs.values()) + self.gen.prefix.tokens()
        left = (self.budget - used) * self.per
        self.lowest = min(self.lowest, left)
        return left


def test_a_request_that_fits_only_after_others_waits_for_them(tiny):
    from engine.runtime.admission import RESERVE, Admission
    from engine.runtime.batching import Batcher
    from engine.runtime.generate import generate
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    s = Sampling(max_tokens=40)
    a, b = prompt_of(tok, 300), prompt_of(tok, 250, "other")
    memory = Memory(len(a) + len(b) + 2 * RESERVE - 50, 100.0)  # one at a time fits
    gen = Batcher(model, tok, PrefixCache(0), 4, admission=Admission(100.0, room=memory))
    memory.gen = gen
    got: dict[str, list[int]] = {}
    started = threading.Event()

    def run_a():
        out = []
        for r in gen(model, tok, a, s):
            out.append(r.token)
            started.set()
        got["a"] = out
    t = threading.Thread(target=run_a)
    t.start()
    assert started.wait(60)
    got["b"] = tokens(gen, model, tok, b, s)  # waits for a, then runs
    t.join(60)
    want = {k: [r.token for r in generate(model, tok, p, s)] for k, p in (("a", a), ("b", b))}
    assert got == want
    assert memory.lowest >= 0  # never over the budget


def test_the_prefix_cache_gives_up_entries_before_anyone_waits(tiny):
    from engine.runtime.admission import Admission
    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    s = Sampling(max_tokens=8)
    first, second = prompt_of(tok, 300), prompt_of(tok, 320, "other")  # no shared prefix
    prefix = PrefixCache(100_000)
    memory = Memory(len(second) + 8 + 100, 100.0)  # no room for both KVs
    gen = Batcher(model, tok, prefix, 4, admission=Admission(100.0, room=memory))
    memory.gen = gen
    tokens(gen, model, tok, first, s)
    assert gen.rest(10) and len(prefix) == 1  # its KV was kept
    assert len(tokens(gen, model, tok, second, s)) == 8
    assert gen.rest(10) and len(prefix) == 1  # the first's went to make room
    assert prefix.fetch([*second, 1])[1] > 0


class Growing(Memory):
    """As Memory, but each answer's KV counts as it grows (its tokens so far), not by
    its reserve."""

    def __call__(self, limit):
        used = sum(len(j.prompt) + j.emitted for j in self.gen._jobs.values()) + \
            self.gen.prefix.tokens()
        left = (self.budget - used) * self.per
        self.lowest = min(self.lowest, left)
        return left


def test_an_answer_that_outgrows_the_memory_ends_there(tiny):
    """Admitted with its reserve, an answer that grows on is watched: where what is left
    can't hold the next steps, it ends with "length" before memory runs out, and the
    batcher goes on serving."""
    from engine.runtime.admission import GUARD_STEPS, RESERVE, Admission
    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    prompt = prompt_of(tok, 20)
    memory = Growing(len(prompt) + RESERVE + 200, 100.0)
    gen = Batcher(model, tok, PrefixCache(0), 4, admission=Admission(100.0, room=memory))
    memory.gen = gen
    out = list(gen(model, tok, prompt, Sampling(max_tokens=3000)))
    assert out[-1].finish_reason == "length"
    n = out[-1].generation_tokens
    assert RESERVE < n < RESERVE + 200 - 2 * GUARD_STEPS + GUARD_STEPS, n
    assert memory.lowest > 0  # it ended before the budget ran out
    assert len(tokens(gen, model, tok, prompt, Sampling(max_tokens=8))) == 8
