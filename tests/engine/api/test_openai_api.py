"""The OpenAI-compatible API, driven by the official openai SDK against a real node
process serving a tiny random-weight llama."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

MODEL = "tiny-llama"
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def oai(tiny_node) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_node.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def greedy(oai: openai.OpenAI, messages=HELLO, n: int = 24,
           **kw) -> openai.types.chat.ChatCompletion:
    return oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=n,
                                       temperature=0, **kw)


def test_models_are_listed_and_described(oai, tiny_node):
    ids = [m.id for m in oai.models.list().data]
    assert MODEL in ids
    # engine.client reads the same model objects as the SDK, and Shoal's facts beside them
    sdk = [(m.id, m.object, m.created, m.owned_by) for m in oai.models.list().data]
    cards = tiny_node.client.models()
    assert [(m.id, m.object, m.created, m.owned_by) for m in cards] == sdk
    assert next(m for m in cards if m.id == MODEL).shoal.layers
    assert oai.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as e:
        oai.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


def test_whole_answer_counts_tokens(oai):
    r = greedy(oai, n=16)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 16
    assert r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + 16


def test_streaming_matches_whole_answer_and_reports_usage(oai):
    whole = greedy(oai, n=20).choices[0].message.content
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].choices == []


def test_max_completion_tokens_is_honoured(oai):
    r = oai.chat.completions.create(model=MODEL, messages=HELLO, max_completion_tokens=5,
                                    temperature=0)
    assert r.usage.completion_tokens == 5


def test_stop_string_ends_the_answer_before_it(oai):
    text = greedy(oai, n=40).choices[0].message.content
    stop = text[10:13]
    r = greedy(oai, n=40, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[:text.index(stop)]


def test_seed_makes_sampling_repeatable(oai):
    def sample(seed: int) -> str:
        return oai.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=24, temperature=1.0, top_p=0.95,
            seed=seed, extra_body={"top_k": 50, "min_p": 0.01}).choices[0].message.content
    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


def test_a_top_k_beyond_the_vocabulary_keeps_every_token(oai):
    """top_k of the vocabulary or more restricts nothing: the same seeded answer as no
    top_k at all, seeded or not, never a 500 (mlx-lm's sampler refuses such a k)."""
    def sample(**extra) -> str:
        return oai.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=12, temperature=0.8, seed=3,
            extra_body=extra).choices[0].message.content
    sample()  # both below then start from the same prefix-cache hit, so the same numbers
    assert sample(top_k=10**6) == sample()
    r = oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4,
                                    temperature=0.8, extra_body={"top_k": 26852})
    assert r.usage.completion_tokens == 4


def test_repetition_penalty_changes_the_answer(oai):
    plain = greedy(oai, n=40).choices[0].message.content
    penalised = greedy(oai, n=40, extra_body={"repetition_penalty": 1.8})
    assert penalised.choices[0].message.content != plain


def test_concurrent_requests_never_mix(oai):
    prompts = [[{"role": "user", "content": f"Question number {i}"}] for i in range(3)]
    expected = [greedy(oai, p, n=30).choices[0].message.content for p in prompts]
    got: dict[int, str] = {}

    def run(i: int) -> None:
        s = oai.chat.completions.create(model=MODEL, messages=prompts[i], max_tokens=30,
                                        temperature=0, stream=True)
        got[i] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [got.get(i) for i in range(3)] == expected


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": HELLO, "n": 2}, "n"),
    ({"model": MODEL, "messages": HELLO, "max_tokens": -2}, "max_tokens"),  # -1: no limit
    ({"model": MODEL, "messages": HELLO, "max_tokens": 10**12}, "max_tokens"),
    ({"model": MODEL, "messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "messages": HELLO, "stop": [1, 2]}, "stop"),
])
def test_bad_requests_get_openai_errors(tiny_node, body, param):
    r = httpx.post(tiny_node.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert tiny_node.client.health().ok


def test_malformed_json_and_unknown_model(tiny_node):
    r = httpx.post(tiny_node.url + "/v1/chat/completions", content=b"{not json",
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(tiny_node.url + "/v1/chat/completions",
                   json={"model": "nope", "messages": HELLO}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert MODEL in r.json()["error"]["message"]  # it says which models there are


def test_prompt_longer_than_context_is_refused(oai):
    long = [{"role": "user", "content": "x" * 5000}]  # one token per byte, 4096 context
    with pytest.raises(openai.BadRequestError) as e:
        greedy(oai, long, stream=True)
    assert e.value.body["code"] == "context_length_exceeded"
    assert greedy(oai, n=3).usage.completion_tokens == 3  # still serving
