"""Quantized KV (8 and 4 bits) in the one-process batcher: requests decoding together
answer token for token as mlx-lm's own one-sequence QuantizedKVCache does, the batch's
KV is the smaller one, and drafts and the prefix cache work on it."""

from __future__ import annotations

import threading

import pytest

from tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.runtime.load import load_model

    # head_dim 64: quantization groups are 64 (or 32) wide
    folder = make_tiny_model(tmp_path_factory.mktemp("qkv") / "tiny-llama",
                             hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    model, tok, _ = load_model(folder)
    return model, tok


def prompt_of(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True)


def mlx_lm_quantized(model, prompt, bits, n):
    """mlx-lm's generate_step over its QuantizedKVCache from the first token: the
    reference a quantized batch must match."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import QuantizedKVCache

    cache = [QuantizedKVCache(64, bits) for _ in model.layers]
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=cache):
        out.append(int(token))
    return out


def run_together(gen, model, tok, asks):
    got = [None] * len(asks)

    def one(i, prompt, s):
        got[i] = [r.token for r in gen(model, tok, prompt, s) if r.token is not None]
    ts = [threading.Thread(target=one, args=(i, p, s)) for i, (p, s) in enumerate(asks)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return got


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_batch_answers_as_mlx_lms_quantized_cache(tiny, bits):
    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok = tiny
    texts = ["hello there", "Tell me about the sea, the waves and the wind. " * 4, "count"]
    prompts = [prompt_of(tok, t) for t in texts]
    lengths = [30, 20, 25]
    want = [mlx_lm_quantized(model, p, bits, n) for p, n in zip(prompts, lengths)]
    prefix = PrefixCache(4096)
    gen = Batcher(model, tok, prefix, 4, kv_bits=bits)
    asks = [(p, Sampling(max_tokens=n, speculative=False)) for p, n in zip(prompts, lengths)]
    assert run_together(gen, model, tok, asks) == want
    # the batch's KV is the quantized one: a finished request's entry in the prefix cache
    cache, hit = prefix.fetch([*prompts[1], *want[1], 1])
    assert hit > 0 and all(getattr(c, "bits", None) == bits for c in cache)
    again = run_together(gen, model, tok, [asks[1]])  # from the prefix cache: the same
    assert again == [want[1]]


def test_drafts_run_on_a_quantized_batch(tiny):
    from engine.runtime.batching import Batcher
    from engine.runtime.drafting import Drafting
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok = tiny
    echo = prompt_of(tok, "one two three four five six seven " * 8)
    plain = Batcher(model, tok, PrefixCache(0), 4, kv_bits=8)
    spec = Batcher(model, tok, PrefixCache(0), 4, kv_bits=8, drafting=Drafting(max_draft=4))
    asks = [(echo, Sampling(max_tokens=40, speculative=True)),
            (prompt_of(tok, "hi"), Sampling(max_tokens=30, speculative=True))]
    off = [(p, Sampling(max_tokens=s.max_tokens, speculative=False)) for p, s in asks]
    assert run_together(spec, model, tok, asks) == run_together(plain, model, tok, off)
    assert sum(g.drafted for g in spec.drafting.governors.values()) > 0


def test_a_head_size_that_groups_cant_split_is_refused_naming_it(tmp_path):
    from engine.runtime.load import load_model
    from engine.runtime.quant_kv import KV

    model, _, _ = load_model(make_tiny_model(tmp_path / "m"))  # head_dim 16
    with pytest.raises(ValueError, match="heads are"):
        KV.for_model(model, 4)
    with pytest.raises(ValueError, match="kv_bits"):
        KV.for_model(model, 3)
