"""vLLM's and llama.cpp's token rules on every generation path, with a real tiny model:
one process, a batch, drafts (alone and in a batch) and rank 0 of a group (lockstep over
an in-process runner here; real two-rank groups in test_token_rules_group.py). Each
answer is checked for what the field must do.

The tiny model's end-of-turn logit is exactly 0, so greedy answers never end on their
own; a logit bias makes it the model's first choice where a test needs one that does."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from tiny import make_tiny_model

EOS = 258  # <|im_end|> in tiny's byte tokenizer (256 bytes, then its three specials)
IM_START = 257


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.runtime.load import load_model

    folder = make_tiny_model(tmp_path_factory.mktemp("rules") / "tiny-llama")
    model, tok, _ = load_model(folder)
    assert tok.eos_token_ids == {EOS}
    return model, tok


class InProcessRunner:
    """lockstep.Runner over a local model: rank 0's sampling path without a group."""

    def __init__(self, model):
        self.model, self.cache = model, None

    def start(self, prompt, sampling, done=None):
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        self.cache = make_prompt_cache(self.model)
        return self._run(mx.array([prompt]))

    def next(self, token):
        import mlx.core as mx
        return self._run(mx.array([[token]]))

    def end(self):
        self.cache = None

    def _run(self, x):
        import mlx.core as mx
        logits = self.model(x, cache=self.cache)[:, -1, :]
        mx.eval(logits)
        return logits


PATHS = ["one", "batched", "drafts", "batched_drafts", "lockstep"]
_batchers: dict = {}


def run(path, tiny, prompt, s):
    """The records of one request on `path`; a batched one runs beside another request."""
    from engine.runtime.drafting import Drafting, drafted_generate
    from engine.runtime.generate import generate
    from engine.runtime.group.lockstep import generate as lockstep

    model, tok = tiny
    if path == "one":
        return list(generate(model, tok, prompt, s))
    if path == "lockstep":
        return list(lockstep(InProcessRunner(model), tok, prompt, s))
    drafted = dataclasses.replace(s, speculative=True)
    if path == "drafts":
        return list(drafted_generate(Drafting(draft_model=model, max_draft=4), model, tok,
                                     prompt, drafted))
    return together(batcher(path, tiny), tiny, [(prompt, drafted),
                                                (prompt_of(tok, "beside"), drafted)])[0]


def batcher(path, tiny):
    from engine.runtime.batching import Batcher
    from engine.runtime.drafting import Drafting
    from engine.runtime.prefix import PrefixCache

    model, tok = tiny
    key = (path, id(model))
    if key not in _batchers:
        drafting = Drafting(draft_model=model, max_draft=4) if path == "batched_drafts" \
            else None
        _batchers[key] = Batcher(model, tok, PrefixCache(0), 4, drafting=drafting)
    return _batchers[key]


def together(gen, tiny, asks):
    model, tok = tiny
    got: list[list] = [[] for _ in asks]
    start = threading.Barrier(len(asks))

    def one(i, prompt, s):
        start.wait(30)
        got[i] = list(gen(model, tok, prompt, s))
    threads = [threading.Thread(target=one, args=(i, p, s)) for i, (p, s) in enumerate(asks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    return got


def prompt_of(tok, text="Tell me about the sea."):
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True)


def tokens(records):
    return [r.token for r in records if r.token is not None]


def text(records):
    return "".join(r.text for r in records)


def sampling(**kw):
    from engine.runtime.sampling import Sampling
    return Sampling(**{"max_tokens": 24, **kw})


def greedy(tiny, n=24, prompt=None):
    from engine.runtime.generate import generate
    model, tok = tiny
    return list(generate(model, tok, prompt or prompt_of(tok), sampling(max_tokens=n)))


@pytest.mark.parametrize("path", PATHS)
def test_ignore_eos_runs_to_max_tokens_where_without_it_the_answer_ends(tiny, path):
    prompt = prompt_of(tiny[1])
    wants_eos = sampling(max_tokens=12, logit_bias=((EOS, 100.0),))
    ends = run(path, tiny, prompt, wants_eos)
    assert ends[-1].finish_reason == "stop" and ends[-1].generation_tokens == 1
    runs = run(path, tiny, prompt, dataclasses.replace(wants_eos, ignore_eos=True))
    assert runs[-1].finish_reason == "length" and runs[-1].generation_tokens == 12
    assert EOS not in tokens(runs)


@pytest.mark.parametrize("path", PATHS)
def test_min_tokens_forbids_every_stop_before_it(tiny, path):
    tok = tiny[1]
    prompt = prompt_of(tok)
    full = tokens(greedy(tiny))
    # end-of-sequence, the model's first choice, comes right after min_tokens
    out = run(path, tiny, prompt, sampling(logit_bias=((EOS, 100.0),), min_tokens=5))
    assert tokens(out)[-1] == EOS and out[-1].generation_tokens == 6
    assert out[-1].finish_reason == "stop" and EOS not in tokens(out)[:5]
    # a stop token the answer has first: not before min_tokens either
    first = full[0]
    out = run(path, tiny, prompt, sampling(stop_token_ids=(first,), min_tokens=3))
    assert first not in tokens(out)[:3] and out[-1].generation_tokens > 3
    # a stop string of the answer's first character: none matches before min_tokens
    early = tok.decode(full[:1])
    out = run(path, tiny, prompt, sampling(stop=(early,), min_tokens=4))
    assert out[-1].generation_tokens >= 4
    plain = run(path, tiny, prompt, sampling(stop=(early,)))
    assert plain[-1].generation_tokens == 1 and plain[-1].stop_sequence == early


@pytest.mark.parametrize("path", PATHS)
def test_stop_token_ids_stop_at_the_first_one_and_include_stop_shows_it(tiny, path):
    tok = tiny[1]
    prompt = prompt_of(tok)
    full = tokens(greedy(tiny))
    stop = full[3]
    at = full.index(stop)
    out = run(path, tiny, prompt, sampling(stop_token_ids=(stop,)))
    assert tokens(out) == full[:at + 1] and out[-1].finish_reason == "stop"
    assert text(out) == tok.decode(full[:at])  # the stop token's text isn't shown
    shown = run(path, tiny, prompt, sampling(stop_token_ids=(stop,), include_stop=True))
    assert text(shown) == tok.decode(full[:at + 1])


@pytest.mark.parametrize("path", PATHS)
def test_include_stop_keeps_the_stop_string(tiny, path):
    tok = tiny[1]
    prompt = prompt_of(tok)
    answer = text(greedy(tiny))
    stop = answer[5:8]
    cut = answer.index(stop)
    out = run(path, tiny, prompt, sampling(stop=(stop,)))
    assert text(out) == answer[:cut] and out[-1].stop_sequence == stop
    kept = run(path, tiny, prompt, sampling(stop=(stop,), include_stop=True))
    assert text(kept) == answer[:cut] + stop and kept[-1].finish_reason == "stop"


@pytest.mark.parametrize("path", PATHS)
def test_special_tokens_are_hidden_unless_skip_special_is_false(tiny, path):
    prompt = prompt_of(tiny[1])
    always = sampling(max_tokens=3, logit_bias=((IM_START, 100.0),))
    hidden = run(path, tiny, prompt, always)
    assert tokens(hidden) == [IM_START] * 3 and text(hidden) == ""
    spaced = run(path, tiny, prompt, dataclasses.replace(always, skip_special=False))
    assert text(spaced) == "<|im_start|> <|im_start|> <|im_start|>"
    joined = run(path, tiny, prompt, dataclasses.replace(always, skip_special=False,
                                                         spaces_between_special=False))
    assert text(joined) == "<|im_start|>" * 3


def test_ordinary_answers_read_as_before(tiny):
    """No special token in the answer: the text is the tokens' plain decoding, as mlx-lm's
    detokenizer gave it before these rules."""
    model, tok = tiny
    out = greedy(tiny, 40)
    assert not set(tokens(out)) & {256, IM_START, EOS}
    assert text(out) == tok.decode(tokens(out))


def test_a_marker_the_splitters_read_is_shown_whatever_skip_special_says(tiny):
    from engine.runtime.generate import generate

    model, tok = tiny

    class Thinking:  # the tokenizer with <|im_start|> as its think marker
        think_start, think_end = "<|im_start|>", "</think>"

        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)
    s = sampling(max_tokens=2, logit_bias=((IM_START, 100.0),))
    out = list(generate(model, Thinking(tok), prompt_of(tok), s))
    assert text(out) == "<|im_start|>" * 2


@pytest.mark.parametrize("path", PATHS)
def test_bad_words_never_appear(tiny, path):
    tok = tiny[1]
    prompt = prompt_of(tok)
    answer = text(greedy(tiny, 40))
    word, char = answer[4:7], answer[10]
    assert len(tok.encode(word, add_special_tokens=False)) == 3
    out = run(path, tiny, prompt, sampling(max_tokens=40, bad_words=(word, char)))
    assert word not in text(out) and char not in text(out)
    assert out[-1].generation_tokens == 40


@pytest.mark.parametrize("path", PATHS)
def test_allowed_token_ids_are_the_only_ones_sampled(tiny, path):
    tok = tiny[1]
    allowed = tuple(tok.encode("abc", add_special_tokens=False))
    for s in (sampling(allowed_token_ids=allowed),
              sampling(allowed_token_ids=allowed, temperature=1.0, seed=4)):
        out = run(path, tiny, prompt_of(tok), s)
        assert set(tokens(out)) <= set(allowed) and len(tokens(out)) == 24
        assert set(text(out)) <= set("abc")


def test_the_samplers_order_is_the_filters_order(tiny):
    """mlx-lm's order spelled out gives mlx-lm's answer; a filter left out of the order
    doesn't run (top_k 1 outside it no longer makes the answer greedy); min_p before or
    after a high temperature keeps different tokens."""
    tok = tiny[1]
    prompt = prompt_of(tok)
    want = tokens(greedy(tiny))
    base = sampling(temperature=0.9, seed=11, top_p=0.95, min_p=0.02, top_k=50)
    default = tokens(run("one", tiny, prompt, base))
    spelled = dataclasses.replace(base, samplers=("top_p", "min_p", "top_k", "temperature"))
    assert tokens(run("one", tiny, prompt, spelled)) == default
    top1 = dataclasses.replace(base, top_k=1)
    assert tokens(run("one", tiny, prompt, top1)) == want
    assert tokens(run("one", tiny, prompt, dataclasses.replace(
        top1, samplers=("top_p", "temperature")))) != want
    hot = sampling(temperature=8.0, seed=5, min_p=0.3, max_tokens=40)
    before = tokens(run("one", tiny, prompt, dataclasses.replace(
        hot, samplers=("temperature", "min_p"))))
    after = tokens(run("one", tiny, prompt, dataclasses.replace(
        hot, samplers=("min_p", "temperature"))))
    assert before != after


def test_filters_keep_what_they_must():
    import math

    import mlx.core as mx

    from engine.runtime.filters import apply_typical_p, chain, keep_top
    from engine.runtime.sampling import Sampling

    p = mx.array([[0.5, 0.3, 0.1, 0.05, 0.05]])
    lp = mx.log(p)
    # entropy ~1.27 nats: surprises 0.69, 1.20, 2.30, 3.00, 3.00 -> order 1, 0, 2, 3, 4
    kept = (apply_typical_p(lp, 0.5) > -math.inf).tolist()[0]
    assert kept == [True, True, False, False, False]
    assert (apply_typical_p(lp, 0.2) > -math.inf).tolist()[0] == [False, True, False,
                                                                   False, False]
    top1 = mx.where(mx.arange(5) == 0, lp, -math.inf)
    assert (keep_top(lp, top1, 3) > -math.inf).sum().item() == 3
    filters, last = chain(Sampling(temperature=1.0, top_k=1, min_keep=4), lambda v: None)
    assert last and (filters[0](lp, None) > -math.inf).sum().item() == 4


def test_typical_p_and_min_keep_change_the_draws(tiny):
    """typical_p tiny keeps one token a step (the most typical): every seed the same
    answer; top_k 1 is greedy, but min_keep 6 lets the seed choose."""
    tok = tiny[1]
    prompt = prompt_of(tok)
    answers = {tuple(tokens(run("one", tiny, prompt, sampling(
        temperature=1.0, seed=seed, typical_p=1e-6)))) for seed in (1, 2, 3)}
    assert len(answers) == 1
    free = {tuple(tokens(run("one", tiny, prompt, sampling(temperature=1.0, seed=seed))))
            for seed in (1, 2, 3)}
    assert len(free) > 1
    want = tokens(greedy(tiny))
    assert tokens(run("one", tiny, prompt, sampling(temperature=1.0, seed=1, top_k=1))) == want
    kept = [tokens(run("one", tiny, prompt, sampling(temperature=1.0, seed=seed, top_k=1,
                                                       min_keep=6))) for seed in (1, 2)]
    assert kept[0] != want or kept[1] != want


def test_xtc_excludes_the_top_choice(tiny):
    tok = tiny[1]
    prompt = prompt_of(tok)
    want = tokens(greedy(tiny))
    cold = sampling(temperature=0.01, seed=2)
    assert tokens(run("one", tiny, prompt, cold)) == want
    xtc = tokens(run("one", tiny, prompt, dataclasses.replace(
        cold, xtc_probability=1.0, xtc_threshold=0.0)))
    assert xtc[0] != want[0]


def test_repetition_context_is_the_penalties_window(tiny):
    prompt = prompt_of(tiny[1])
    want = tokens(greedy(tiny, 40))
    off = tokens(run("one", tiny, prompt, sampling(max_tokens=40, repetition_penalty=3.0,
                                                   repetition_context=0)))
    assert off == want
    short = tokens(run("one", tiny, prompt, sampling(max_tokens=40, repetition_penalty=3.0,
                                                     repetition_context=1)))
    wide = tokens(run("one", tiny, prompt, sampling(max_tokens=40, repetition_penalty=3.0)))
    assert short != wide


@pytest.mark.parametrize("path", ["batched", "batched_drafts", "drafts", "lockstep"])
def test_seeded_requests_with_every_filter_answer_as_alone(tiny, path):
    s = sampling(max_tokens=30, temperature=0.9, seed=9, typical_p=0.95, min_keep=2,
                 top_p=0.95, xtc_probability=0.5, xtc_threshold=0.05,
                 samplers=("typical_p", "xtc", "temperature", "top_p"), min_tokens=3,
                 bad_words=("ab",), repetition_penalty=1.2, repetition_context=8)
    prompt = prompt_of(tiny[1])
    alone = tokens(run("one", tiny, prompt, s))
    assert tokens(run(path, tiny, prompt, s)) == alone


def test_harmony_markers_reach_the_splitter_and_other_specials_do_not(tmp_path):
    """gpt-oss's channel markers are special tokens; the Harmony splitter reads them, so
    they are shown whatever skip_special says, while another special token is hidden."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    from engine.runtime.harmony import HarmonySplitter, is_harmony
    from engine.runtime.stops import Shown

    specials = ["<|endoftext|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                "<|constrain|>", "<|call|>", "<|return|>"]
    t = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))},
                             merges=[]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens(specials)
    hf = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|return|>")
    tok = TokenizerWrapper(hf, BPEStreamingDetokenizer)
    assert is_harmony(tok)
    # the vocabulary is read once per tokenizer (it is built anew at every get_vocab)
    reads = []
    tok.get_vocab = lambda: reads.append(1) or {}
    assert is_harmony(tok) and not reads
    answer = "<|channel|>analysis<|message|>Hm.<|end|><|endoftext|><|start|>assistant" \
             "<|channel|>final<|message|>Hi!"
    ids = hf.encode(answer, add_special_tokens=False)
    shown = Shown(tok, sampling())
    out = "".join(shown.step(i, None, None)[0] for i in ids)
    assert out == answer.replace("<|endoftext|>", "")
    splitter = HarmonySplitter()
    pieces = splitter.feed(out) + splitter.finish()
    assert pieces == [("reasoning", "Hm."), ("content", "Hi!")]
