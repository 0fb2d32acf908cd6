"""The prefix KV cache on one node, as clients see it: a chat's next turn and a resend
reuse the KV of earlier work (reported in each protocol's own usage fields), and the
answers stay token for token what mlx-lm gives with no cache at all."""

from __future__ import annotations

import anthropic
import openai
import pytest

MODEL = "tiny-llama"
SYSTEM = "You are a careful assistant who answers briefly. " * 12


def turns() -> list[list[dict]]:
    chat = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Name a colour."}]
    out = [chat]
    for reply, ask in (("Blue.", "Another?"), ("Green.", "And one more?")):
        out.append(out[-1] + [{"role": "assistant", "content": reply},
                              {"role": "user", "content": ask}])
    return out + [out[-1]]  # and the last one again, exactly


@pytest.fixture(scope="module")
def uncached(tiny_model_dir) -> list[str]:
    """mlx-lm itself, greedy, a fresh cache every time."""
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tok = load(str(tiny_model_dir))
    return ["".join(r.text for r in stream_generate(
        model, tok, tok.apply_chat_template(m, add_generation_prompt=True), max_tokens=12,
        sampler=make_sampler(temp=0.0))) for m in turns()]


def test_turns_reuse_the_cache_and_answer_the_same(fresh_node, uncached):
    oai = openai.OpenAI(base_url=fresh_node.url + "/v1", api_key="x", max_retries=0)
    got, cached, prompt = [], [], []
    for messages in turns():
        r = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                        temperature=0)
        got.append(r.choices[0].message.content)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        prompt.append(r.usage.prompt_tokens)
    assert got == uncached
    assert cached[0] == 0
    assert all(c >= 0.8 * p for c, p in zip(cached[1:3], prompt[:2]))  # the earlier turn
    assert cached[3] == prompt[3] - 1  # an exact resend runs only its last token


def test_anthropic_and_streamed_openai_report_cache_reads(fresh_node):
    a = anthropic.Anthropic(base_url=fresh_node.url, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": SYSTEM + " Hi."}]
    first = a.messages.create(model=MODEL, max_tokens=4, messages=msgs)
    again = a.messages.create(model=MODEL, max_tokens=4, messages=msgs)
    assert first.usage.cache_read_input_tokens == 0
    total = first.usage.input_tokens
    assert again.usage.cache_read_input_tokens == total - 1
    assert again.usage.input_tokens == 1
    oai = openai.OpenAI(base_url=fresh_node.url + "/v1", api_key="x", max_retries=0)
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_linear_attention_state_hits_each_turn_on_a_batching_node(tmp_path):
    """qwen3_next's recurrent state can't be rewound, so the batching node keeps a copy of
    it at each prompt's end: the chat's next turn still hits, and the answers stay exact."""
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    from families import make_family_model
    from nodes import NodeProcess, home_with

    model = make_family_model(tmp_path / "tiny-next", "qwen3_next", seed=2)
    chats = turns()[:3]
    m, tok = load(str(model))
    want = ["".join(r.text for r in stream_generate(
        m, tok, tok.apply_chat_template(c, add_generation_prompt=True), max_tokens=8,
        sampler=make_sampler(temp=0.0))) for c in chats]
    node = NodeProcess(home_with(tmp_path, model), "tiny-next").wait_healthy()
    try:
        node.wait_ready()
        assert node.client.status().streams.max > 1  # served by the batcher
        oai = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0)
        got, cached = [], []
        for c in chats:
            r = oai.chat.completions.create(model="tiny-next", messages=c, max_tokens=8,
                                            temperature=0)
            got.append(r.choices[0].message.content)
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
        assert got == want
        assert cached[0] == 0 and cached[1] > 0 and cached[2] > cached[1], cached
    finally:
        node.stop()
