"""Speculative decoding on one node: drafts never change a greedy answer, sampling keeps the
model's distribution, requests draft together in a batch, each at its own length, and the
governor stops drafting where it loses."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from tiny import make_tiny_model, write_byte_tokenizer

ECHO = ("Return this file with one change, rename total to sum:\n"
        + "".join(f"def f{i}(x):\n    total = x + {i}\n    return total\n" for i in range(6)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.runtime.load import load_model

    folder = make_tiny_model(tmp_path_factory.mktemp("spec") / "tiny-llama")
    model, tok, _ = load_model(folder)
    return model, tok, folder


def prompt_of(tok, text: str = ECHO) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True)


def tokens(records) -> list[int]:
    return [r.token for r in records if r.token is not None]


def plain(model, tok, prompt, sampling) -> list:
    from engine.runtime.generate import generate
    return list(generate(model, tok, prompt, sampling))


def test_prompt_lookup_guesses_what_followed_the_last_match():
    from engine.runtime.speculative import PromptLookup

    look = PromptLookup(max_ngram=3, min_ngram=2)
    ctx = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    assert look.propose(ctx, 2) == [4, 5]  # "2 3" was followed by "4 5"
    ctx += [7, 8, 2, 3]  # the later "2 3" is followed by "7 8": the most recent wins
    assert look.propose(ctx, 3) == [7, 8, 2]
    assert look.propose(ctx + [42, 43], 3) == []  # "42 43" never occurred before
    assert look.propose(ctx, 0) == []


def test_greedy_answers_are_the_same_token_for_token(tiny):
    from engine.runtime.drafting import Drafting, drafted_generate
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    s = Sampling(max_tokens=80, temperature=0.0, speculative=True)  # drafts every pass
    drafting = Drafting()
    for text in (ECHO, "Tell me about the sea."):
        prompt = prompt_of(tok, text)
        want = tokens(plain(model, tok, prompt, s))
        got = list(drafted_generate(drafting, model, tok, prompt, s))
        assert tokens(got) == want
        assert got[-1].finish_reason == "length" and got[-1].generation_tokens == 80
    assert drafting.governor.drafted > 0  # it did draft (the tiny model repeats itself)


def test_a_draft_model_that_agrees_is_kept_whole_and_changes_nothing(tiny):
    from engine.runtime.drafting import Drafting, drafted_generate
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    s = Sampling(max_tokens=40, temperature=0.0, speculative=True)
    prompt = prompt_of(tok, "Count with me.")
    want = tokens(plain(model, tok, prompt, s))
    drafting = Drafting(draft_model=model, max_draft=4)  # the target drafts for itself
    got = list(drafted_generate(drafting, model, tok, prompt, s))
    assert tokens(got) == want
    last = got[-1]
    assert last.drafted_tokens > 0 and last.accepted_tokens == last.drafted_tokens


def test_seeded_sampling_draws_as_without_drafts(tiny):
    """A seeded sampler draws once per kept token, in order: the same tokens as without
    drafts (up to ties the batched pass computes differently, none in this model)."""
    from engine.runtime.drafting import Drafting, drafted_generate
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    prompt = prompt_of(tok)
    for seed in (1, 2, 3):
        s = Sampling(max_tokens=30, temperature=0.7, seed=seed, speculative=True)
        want = tokens(plain(model, tok, prompt, s))
        got = tokens(drafted_generate(Drafting(draft_model=model), model, tok, prompt, s))
        assert got == want, seed


class FixedLogits:
    """A stand-in for a model whose next-token distribution is known exactly, so the
    accept/reject rule itself can be checked against it (no real model has a known p)."""

    def __init__(self, logits):
        import mlx.core as mx
        self.row = mx.array(logits)

    def __call__(self, ids, cache=None):
        import mlx.core as mx
        n = ids.shape[1]
        return mx.broadcast_to(self.row, (1, n, self.row.shape[0]))


def test_the_accept_rule_keeps_the_models_distribution():
    """With a guess of token 0 (p = 0.5) the emitted token is still distributed as p: the
    guess is kept half the time and a refusal draws from the rest. Unseeded draws, 4,000
    of them: each frequency within 4 standard errors of p."""
    import math

    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    from engine.runtime.speculative import Governor, Speculator

    p = [0.5, 0.3, 0.15, 0.05]
    model = FixedLogits([math.log(x) for x in p])

    class Guess:
        def propose(self, context, k):
            return [0] * k

    mx.random.seed(7)
    counts: collections.Counter[int] = collections.Counter()
    n = 4000
    gov = Governor(max_draft=1)
    gov.base, gov.per, gov.kept, gov.refused = 1.0, 0.0, 100.0, 1.0  # always draft one
    for _ in range(n):
        spec = Speculator(model, [], [5], make_sampler(temp=1.0), [], Guess(), gov)
        counts[spec.step(2).tokens[0]] += 1
    for token, want in enumerate(p):
        se = math.sqrt(want * (1 - want) / n)
        assert abs(counts[token] / n - want) < 4 * se, (token, counts)


def test_the_governor_stops_drafting_where_it_loses_and_drafts_where_it_pays():
    from engine.runtime.speculative import Governor

    g = Governor(max_draft=6)
    for _ in range(40):  # guesses cost as much as a token each and are always refused
        m = g.length(100)
        g.observed(m, 0, 1.0 + 1.0 * m)
    assert g.best(6) == 0
    probes = [g.length(100) > 0 for _ in range(1024)]  # probes, ever fewer
    assert 2 <= sum(probes) <= 1024 // Governor.PROBE_EVERY // 2
    assert sum(probes[512:]) <= 2
    g = Governor(max_draft=6)
    for _ in range(40):  # cheap guesses, all kept
        m = g.length(100)
        g.observed(m, m, 1.0 + 0.1 * m)
    assert g.best(6) == 6
    assert g.length(3) <= 3  # never past what the request may still emit


def test_a_batch_governor_learns_that_the_first_guess_is_dear_and_counts_riders():
    """A batch of 4 where, as on this CPU, one guess doubles a pass and six cost 3.3x:
    guesses of which one is kept (a loss at every width) stop after the first passes,
    guesses all kept still pay, and guesses for one sequence of four don't pay for the
    three that ride."""
    from engine.runtime.speculative import Governor

    cost = {0: 1.0, 1: 2.2, 2: 2.5, 3: 2.7, 4: 2.9, 5: 3.1, 6: 3.33}
    g = Governor(max_draft=6)
    widths = []
    for _ in range(300):
        m = g.width([g.length(100)] * 4)
        widths.append(m)
        g.observed_rows([(m, min(m, 1))] * 4, m, cost[m])  # the first guess kept
    assert sum(w > 0 for w in widths[100:]) <= 200 // Governor.PROBE_EVERY
    g = Governor(max_draft=6)
    for _ in range(60):
        m = g.width([g.length(100)] * 4)
        g.observed_rows([(m, m)] * 4, m, cost[m])  # every guess kept
    assert g.width([g.length(100)] * 4) == 6
    assert g.width([6, 0, 0, 0]) == 0  # one row's guesses don't pay for three riders


def test_a_draft_model_with_another_vocabulary_is_refused_naming_both(tiny, tmp_path):
    from transformers import PreTrainedTokenizerFast

    from engine.runtime.speculative import check_draft

    _, tok, folder = tiny
    other = tmp_path / "other"
    other.mkdir()
    write_byte_tokenizer(other)
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(str(other / "tokenizer.json"))
    t.add_special_tokens(["<|fim_prefix|>"])  # one token more than the target's
    t.save(str(other / "tokenizer.json"))
    draft_tok = PreTrainedTokenizerFast(tokenizer_file=str(other / "tokenizer.json"))
    with pytest.raises(ValueError) as e:
        check_draft(tok, draft_tok, "tiny-llama", "other-draft")
    assert "other-draft" in str(e.value) and "tiny-llama" in str(e.value)
    check_draft(tok, tok, "tiny-llama", "same")  # the same tokenizer passes


def run_together(gen, model, tok, asks) -> list[list]:
    """Every (prompt, sampling) in `asks` through the batcher at once, one thread each."""
    got: list[list] = [[] for _ in asks]
    start = threading.Barrier(len(asks))

    def one(i, prompt, s):
        start.wait(30)
        got[i] = list(gen(model, tok, prompt, s))
    threads = [threading.Thread(target=one, args=(i, p, s)) for i, (p, s) in enumerate(asks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
        assert not t.is_alive()
    return got


def test_requests_draft_together_each_at_its_length_and_riders_ride(tiny):
    """Five requests in one batch: greedy ones that draft, one that turned drafting off,
    a seeded sampler, one with a repetition penalty. Each answer is the one it gets alone
    without drafts, and some steps ran guesses for some sequences while others rode."""
    from engine.runtime.batching import Batcher
    from engine.runtime.drafting import Drafting
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    gen = Batcher(model, tok, PrefixCache(0), 8, drafting=Drafting(max_draft=4))
    echo, sea = prompt_of(tok), prompt_of(tok, "Tell me about the sea.")
    asks = [(echo, Sampling(max_tokens=90, speculative=True)),
            (sea, Sampling(max_tokens=40, speculative=True)),
            (echo, Sampling(max_tokens=60, speculative=False)),
            (echo, Sampling(max_tokens=50, temperature=0.7, seed=3, speculative=True)),
            (sea, Sampling(max_tokens=45, repetition_penalty=1.3, speculative=True))]
    got = run_together(gen, model, tok, asks)
    for (prompt, s), out in zip(asks, got, strict=True):
        assert tokens(out) == tokens(plain(model, tok, prompt, s)), s
        assert out[-1].finish_reason == "length"
    assert got[0][-1].drafted_tokens > 0 and got[0][-1].accepted_tokens > 0
    assert got[2][-1].drafted_tokens == 0  # its "speculative": false held in the batch
    batched = [g for size, g in gen.drafting.governors.items() if size > 1]
    assert sum(g.drafted for g in batched) > 0  # guesses ran beside other sequences


def test_an_end_token_inside_kept_guesses_ends_the_answer_there(tiny):
    """The greedy answer's third token is made an end token, and the model drafts for
    itself (every guess kept): the pass that keeps it and the guesses after it ends the
    answer there, and the KV kept for the prefix cache is exactly the answer's."""
    from engine.runtime.batching import Batcher
    from engine.runtime.drafting import Drafting
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    prompt, s = prompt_of(tok), Sampling(max_tokens=80, speculative=True)
    full = tokens(plain(model, tok, prompt, s))
    end = full[2]
    cut = full[:full.index(end) + 1]
    assert len(cut) == 3

    class Ends:  # the tokenizer with one more end token
        def __init__(self, inner):
            self._inner, self.eos_token_ids = inner, {*inner.eos_token_ids, end}

        def __getattr__(self, name):
            return getattr(self._inner, name)
    ends = Ends(tok)
    prefix = PrefixCache(4096)
    gen = Batcher(model, ends, prefix, 4, drafting=Drafting(draft_model=model, max_draft=6))
    a, b = run_together(gen, model, ends, [(prompt, s), (prompt_of(tok, "Hi"), s)])
    assert tokens(a) == cut and a[-1].finish_reason == "stop"
    assert a[-1].drafted_tokens > 0
    deadline = time.monotonic() + 10
    while prefix.fetch([*prompt, *cut, 1])[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # the batcher keeps the KV just after the last token is out
    cache, hit = prefix.fetch([*prompt, *cut, 1])
    assert hit == len(prompt) + len(cut)  # the cache held exactly what was answered


def test_a_request_can_turn_drafting_off_or_on(tiny):
    from engine.runtime.drafting import Drafting, drafted_generate
    from engine.runtime.sampling import Sampling

    model, tok, _ = tiny
    prompt = prompt_of(tok)
    off = list(drafted_generate(Drafting(draft_model=model), model, tok, prompt,
                                Sampling(max_tokens=20, speculative=False)))
    assert off[-1].drafted_tokens == 0
    on = list(drafted_generate(Drafting(enabled=False, draft_model=model), model, tok,
                               prompt, Sampling(max_tokens=20, speculative=True)))
    assert on[-1].drafted_tokens > 0 and tokens(on) == tokens(off)
    capped = list(drafted_generate(Drafting(draft_model=model, max_draft=6), model, tok,
                                   prompt, Sampling(max_tokens=20, draft_tokens=1,
                                                    speculative=True)))
    assert 0 < capped[-1].drafted_tokens <= 19  # one guess per pass at most
