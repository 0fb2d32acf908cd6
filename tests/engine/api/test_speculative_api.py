"""Speculative decoding through the node's APIs: a client can turn it off or cap it, every
API's usage says how many tokens were drafted and kept, the answer is the same either way,
and a draft length out of range is a 400 naming the field."""

from __future__ import annotations

import httpx
import pytest

MODEL = "tiny-llama"
ECHO = "Say this back: " + "one two three four, " * 8


def chat(url: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "max_tokens": 48, "temperature": 0,
        "messages": [{"role": "user", "content": ECHO}], **extra})


def test_the_answer_is_the_same_with_drafts_and_usage_counts_them(tiny_node):
    on, off = chat(tiny_node.url, speculative=True), chat(tiny_node.url, speculative=False)
    assert on.status_code == off.status_code == 200, on.text
    assert on.json()["choices"][0]["message"] == off.json()["choices"][0]["message"]
    spec_on, spec_off = on.json()["usage"]["speculative"], off.json()["usage"]["speculative"]
    assert spec_off == {"drafted_tokens": 0, "accepted_tokens": 0}
    assert spec_on["drafted_tokens"] >= spec_on["accepted_tokens"] >= 0
    details = on.json()["usage"]["completion_tokens_details"]  # OpenAI's own fields
    assert details["accepted_prediction_tokens"] == spec_on["accepted_tokens"]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "draft_tokens": 17}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "draft_tokens": 0}),
    ("/v1/messages", {"model": MODEL, "max_tokens": 8, "draft_tokens": 99,
                      "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/responses", {"model": MODEL, "input": "x", "draft_tokens": -1}),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "options": {"draft_tokens": 40}}),
])
def test_a_draft_length_out_of_range_is_a_400_naming_it(tiny_node, path, body):
    r = httpx.post(tiny_node.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "draft_tokens" in r.text


def test_every_api_reports_the_drafts(tiny_node):
    url, ask = tiny_node.url, [{"role": "user", "content": ECHO}]
    msgs = httpx.post(url + "/v1/messages", timeout=120, json={
        "model": MODEL, "max_tokens": 24, "messages": ask, "draft_tokens": 2}).json()
    assert set(msgs["usage"]["speculative"]) == {"drafted_tokens", "accepted_tokens"}
    resp = httpx.post(url + "/v1/responses", timeout=120, json={
        "model": MODEL, "max_output_tokens": 24, "input": ECHO}).json()
    assert "speculative" in resp["usage"]
    olla = httpx.post(url + "/api/chat", timeout=120, json={
        "model": MODEL, "messages": ask, "stream": False,
        "options": {"num_predict": 24, "speculative": False}}).json()
    assert olla["speculative"] == {"drafted_tokens": 0, "accepted_tokens": 0}


def test_a_node_with_a_draft_model_drafts_and_plans_count_it(tmp_path, tiny_model_dir):
    """The draft model is the target itself here (every guess kept); the node tells peers
    and the topology its size, so plans of a model served alone count it."""
    from nodes import NodeProcess, home_with

    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "tiny-llama",
                       "--draft-model", "tiny-llama").wait_healthy()
    try:
        node.wait_ready()
        r = chat(node.url, speculative=True)
        assert r.status_code == 200, r.text
        spec = r.json()["usage"]["speculative"]
        assert spec["drafted_tokens"] > 0 and spec["accepted_tokens"] == spec["drafted_tokens"]
        me = httpx.get(node.url + "/shoal/topology", timeout=30).json()["nodes"][0]
        draft = me["draft"]  # as GET /shoal/node tells peers
        assert draft["model"] == "tiny-llama" and draft["bytes"] > 0
        assert draft["kv_per_token"] > 0
        plan = node.client.plan("tiny-llama")  # one node: the draft is loaded beside it
        assert plan.placements[0].ranks[0].memory.draft > draft["bytes"]
    finally:
        node.stop()


def test_a_draft_model_with_another_vocabulary_is_refused_naming_both(tmp_path,
                                                                      tiny_model_dir):
    import shutil

    from tokenizers import Tokenizer

    from nodes import NodeProcess, home_with

    home = home_with(tmp_path, tiny_model_dir)
    other = home / "models" / "other-draft"
    shutil.copytree(tiny_model_dir, other)
    t = Tokenizer.from_file(str(other / "tokenizer.json"))
    t.add_special_tokens(["<|fim_prefix|>"])  # one token more than the target's
    t.save(str(other / "tokenizer.json"))
    node = NodeProcess(home, "tiny-llama", "--draft-model", "other-draft").wait_healthy()
    try:
        r = chat(node.url)
        assert r.status_code >= 400
        text = r.text
        assert "other-draft" in text and "tiny-llama" in text and "vocabulary" in text
    finally:
        node.stop()
