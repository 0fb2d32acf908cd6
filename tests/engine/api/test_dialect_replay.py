"""Real clients' requests, recorded from their published request builders
(tests/fixtures/dialects/*.json: each names its source file and commit), replayed against a
node on the tiny model (a byte-level tokenizer, ChatML): vLLM's benchmark client and tests,
llama.cpp's web UIs and server tests, lm-evaluation-harness's local-completions. Each must
get a 200 that does what it asked (ignore_eos runs to max_tokens, continuous usage is on
every chunk, echo returns the prompt with its logprobs, ...), or, where the client asks for
something Shoal refuses, a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes import NodeProcess

MODEL = "tiny-llama"
FIXTURES = sorted((Path(__file__).parents[2] / "fixtures" / "dialects").glob("*.json"))
ASSISTANT = "<|im_start|>assistant\n"  # the tiny model's ChatML generation prompt


class Reply:
    def __init__(self, r: httpx.Response, streamed: bool):
        self.status = r.status_code
        self.text = r.text
        self.events: list[dict[str, Any]] = []
        self.done = False
        if streamed and r.status_code == 200:
            for line in r.text.splitlines():
                if line == "data: [DONE]":
                    self.done = True
                elif line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))
        self.body: Any = r.json() if not streamed and r.headers.get(
            "Content-Type", "").startswith("application/json") else None

    def usage(self) -> dict[str, int]:
        last = [e["usage"] for e in self.events if e.get("usage")]
        assert last, self.text[-500:]
        return last[-1]

    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("choices")]


def _resolve(node: NodeProcess, v: Any) -> Any:
    """The body with the model placeholder named and "$tokens_of:<text>" as the tiny
    model's token ids of the text (the ids a client's own tokenizer would give)."""
    if isinstance(v, dict):
        return {k: _resolve(node, x) for k, x in v.items()}
    if isinstance(v, list):
        return [_resolve(node, x) for x in v]
    if v == "MODEL":
        return MODEL
    if isinstance(v, str) and v.startswith("$tokens_of:"):
        r = httpx.post(node.url + "/tokenize", json={"content": v.split(":", 1)[1]},
                       timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["tokens"]
    return v


def _send(node: NodeProcess, fixture: dict[str, Any]) -> tuple[dict[str, Any], Reply]:
    body = _resolve(node, fixture["body"])
    r = httpx.post(node.url + fixture["route"], json=body, timeout=300)
    return body, Reply(r, bool(body.get("stream")))


def _ok(reply: Reply) -> None:
    assert reply.status == 200, reply.text[:1000]


def _streamed(reply: Reply) -> None:
    _ok(reply)
    assert reply.done and reply.chunks(), reply.text[-500:]


def ran_to_max_tokens(body: dict[str, Any], reply: Reply) -> None:
    _streamed(reply)
    wanted = body.get("max_tokens") or body["max_completion_tokens"]
    assert reply.usage()["completion_tokens"] == wanted, "ignore_eos runs to max_tokens"
    assert reply.chunks()[-1]["choices"][0]["finish_reason"] == "length"


def usage_on_every_chunk(body: dict[str, Any], reply: Reply) -> None:
    _streamed(reply)
    for e in reply.events:
        u = e.get("usage")
        assert u is not None and u["prompt_tokens"] > 0, e
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], e
    assert reply.events[-1]["choices"] == [], "the final usage chunk, as vLLM sends it"


def echoed_with_logprobs(body: dict[str, Any], reply: Reply) -> None:
    _ok(reply)
    choice = reply.body["choices"][0]
    prompt = body["prompt"]
    if isinstance(prompt, str):
        assert choice["text"].startswith(prompt)
    lp = choice["logprobs"]
    n_prompt = reply.body["usage"]["prompt_tokens"]
    assert len(lp["tokens"]) == n_prompt + reply.body["usage"]["completion_tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert all(1 <= len(t) <= body["logprobs"] + 1 for t in lp["top_logprobs"][1:])


def refused_naming(field: str) -> Callable[[dict[str, Any], Reply], None]:
    def check(body: dict[str, Any], reply: Reply) -> None:
        assert reply.status == 400, reply.text[:500]
        assert (reply.body["error"]["param"] or "").startswith(field), reply.body
    return check


def chatted(body: dict[str, Any], reply: Reply) -> None:
    _streamed(reply)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in reply.chunks())
    assert text, "an answer"
    assert reply.chunks()[-1]["choices"][0]["finish_reason"] in ("stop", "length")


SAYING = "Here is a common saying about apple. An apple a day, keeps"


def continued(echo: bool) -> Callable[[dict[str, Any], Reply], None]:
    def check(body: dict[str, Any], reply: Reply) -> None:
        _ok(reply)
        choice = reply.body["choices"][0]
        assert choice["finish_reason"] in ("stop", "length")
        assert choice["message"]["role"] == "assistant"
        assert (SAYING in choice["message"]["content"]) is echo, choice["message"]
    return check


def tokenized(body: dict[str, Any], reply: Reply) -> None:
    _ok(reply)
    tokens = reply.body["tokens"]
    text = body.get("content", body.get("prompt"))
    if body.get("with_pieces"):
        # a piece is its text, or its bytes where they aren't UTF-8 alone (as llama.cpp's)
        joined = b"".join(p.encode() if isinstance(p, str) else bytes(p)
                          for p in (t["piece"] for t in tokens))
        assert joined == text.encode()
        assert all(isinstance(t["id"], int) for t in tokens)
    else:
        assert all(isinstance(t, int) for t in tokens) and len(tokens) >= len(text)


def detokenized(body: dict[str, Any], reply: Reply) -> None:
    _ok(reply)
    assert reply.body["content"] == "What is the capital of France ?"


def templated(generation_prompt: bool) -> Callable[[dict[str, Any], Reply], None]:
    def check(body: dict[str, Any], reply: Reply) -> None:
        _ok(reply)
        prompt = reply.body["prompt"]
        assert "What is today?" in prompt
        assert prompt.endswith(ASSISTANT) is generation_prompt, prompt
    return check


CHECKS: dict[str, Callable[[dict[str, Any], Reply], None]] = {
    "vllm-bench-completions": ran_to_max_tokens,
    "vllm-bench-chat": ran_to_max_tokens,
    "vllm-test-continuous-usage": usage_on_every_chunk,
    "vllm-test-echo-logprobs": echoed_with_logprobs,
    "vllm-test-invalid-regex": refused_naming("structured_outputs"),
    "vllm-test-chat-echo-continue": continued(True),
    "vllm-test-chat-continue": continued(False),
    # -1 asks for the whole vocabulary's logprobs: a 400 naming the field
    "vllm-test-chat-prompt-logprobs-all": refused_naming("prompt_logprobs"),
    "vllm-test-chat-top-logprobs-all": refused_naming("top_logprobs"),
    "llamacpp-webui-chat": chatted,
    "llamacpp-webui-react-chat": chatted,
    "llamacpp-test-tokenize": tokenized,
    "llamacpp-test-tokenize-bos": tokenized,
    "llamacpp-test-tokenize-pieces": tokenized,
    "llamacpp-test-detokenize": detokenized,
    "llamacpp-test-apply-template": templated(True),
    "llamacpp-test-apply-template-no-generation-prompt": templated(False),
    "lmeval-local-completions-loglikelihood": echoed_with_logprobs,
    "lmeval-remote-tokenizer-probe": tokenized,
}


def test_every_fixture_says_where_it_came_from_and_is_checked():
    assert {f.stem for f in FIXTURES} == set(CHECKS)
    for f in FIXTURES:
        fixture = json.loads(f.read_text())
        assert set(fixture) == {"source", "route", "body"}, f.name
        assert fixture["source"].startswith("github.com/") and "@" in fixture["source"]
        assert fixture["body"].get("model", "MODEL") == "MODEL", "a placeholder, not a name"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_a_real_clients_request_does_what_it_asks(tiny_node, path):
    fixture = json.loads(path.read_text())
    body, reply = _send(tiny_node, fixture)
    CHECKS[path.stem](body, reply)
