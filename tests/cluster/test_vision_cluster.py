"""A vision model placed over two real nodes (a pipeline: rank 0's node holds the tower):
an image through the OpenAI SDK, sent to either node, is answered as one process answers
it, its tokens counted in usage; the same image re-sent hits the prefix cache."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from nodes import NodeProcess, start_cluster
from tests_support import wait_until
from tiny_vision import image_input, make_tiny_gemma3, png

VISION = "tiny-gemma3"
ASK = "What is in this picture?"
IMAGE = png(40, 30, 5)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    root = tmp_path_factory.mktemp("vision-pair")
    folder = make_tiny_gemma3(root / "model" / VISION)
    nodes = start_cluster(root, folder, 2)
    try:
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def in_process(folder: Path, max_tokens: int) -> tuple[str, int]:
    """(the answer, its prompt's tokens) on one process, as the worker's own path runs."""
    import threading
    from functools import partial

    from engine.protocol import Delta, Done, GenerateRequest, SamplingRequest
    from engine.runtime.generate import generate
    from engine.runtime.load import load_model
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.request import run
    from engine.runtime.vision.tower import Vision

    model, tokenizer, _ = load_model(folder)
    req = GenerateRequest(
        messages=[{"role": "user", "content": ASK, "parts": [
            {"type": "text", "text": ASK}, {"type": "image", "image": 0}]}],
        images=[image_input(IMAGE)],  # type: ignore[list-item]
        sampling=SamplingRequest(max_tokens=max_tokens, temperature=0.0))
    out: list[Any] = []
    run("r", req, model, tokenizer, 4096, partial(generate, prefix=PrefixCache(0)),
        threading.Event(), out.append, vision=Vision(folder, model))
    assert isinstance(out[-1], Done)
    return "".join(m.text for m in out if isinstance(m, Delta)), out[-1].prompt_tokens


def test_an_image_through_a_pipeline_of_two_nodes(pair: list[NodeProcess]) -> None:
    a, b = pair
    want, prompt_tokens = in_process(a.home / "models" / VISION, 8)
    r = httpx.post(a.url + "/shoal/instances", timeout=300, json={
        "model": VISION, "strategy": "pipeline",
        "nodes": [{"node": "self", "layers": [0, 3]},
                  {"node": b.client.status().cluster.id, "layers": [3, 6]}]})
    assert r.status_code == 201, r.text
    data = base64.b64encode(IMAGE).decode()
    msgs: Any = [{"role": "user", "content": [
        {"type": "text", "text": ASK},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}]
    oa = openai.OpenAI(base_url=a.url + "/v1", api_key="k", max_retries=0, timeout=120)
    first = oa.chat.completions.create(model=VISION, messages=msgs, max_tokens=8,
                                       temperature=0)
    assert first.choices[0].message.content == want
    assert first.usage is not None and first.usage.prompt_tokens == prompt_tokens
    wait_until(lambda: any(m.id == VISION for m in b.client.models()), 10)
    ob = openai.OpenAI(base_url=b.url + "/v1", api_key="k", max_retries=0, timeout=120)
    again = ob.chat.completions.create(model=VISION, messages=msgs, max_tokens=8,
                                       temperature=0)  # b relays to rank 0's node
    assert again.choices[0].message.content == want
    details = again.usage.prompt_tokens_details if again.usage else None
    assert details is not None and (details.cached_tokens or 0) > 0
