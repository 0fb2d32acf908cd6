"""A real node serving a tiny Gemma 3 vision checkpoint: an image through the OpenAI and
Anthropic SDKs is answered as the worker's own path answers in process (itself token for
token mlx-vlm's, test_vision.py), its tokens counted in usage; the same image re-sent hits
the prefix cache; Ollama's images too; a text request on the same model still works."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from engine.protocol import Delta, Done, GenerateRequest, SamplingRequest
from nodes import NodeProcess, home_with
from tiny_vision import image_input, make_tiny_gemma3, png

VISION = "tiny-gemma3"
ASK = "What is in this picture?"
IMAGE = png(40, 30, 5)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
         ) -> Iterator[NodeProcess]:
    home = home_with(tmp_path_factory.mktemp("vision-node"), tiny_model_dir)
    make_tiny_gemma3(home / "models" / VISION)
    n = NodeProcess(home, VISION).wait_healthy()
    try:
        n.wait_ready()
        yield n
    finally:
        n.stop()


def in_process(folder: Path, max_tokens: int) -> tuple[str, int]:
    from functools import partial

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
    done = out[-1]
    assert isinstance(done, Done)
    return "".join(m.text for m in out if isinstance(m, Delta)), done.prompt_tokens


def test_sdks_get_the_image_answered(node: NodeProcess) -> None:
    want, prompt_tokens = in_process(node.home / "models" / VISION, 8)
    oa = openai.OpenAI(base_url=node.url + "/v1", api_key="k", max_retries=0, timeout=120)
    data = base64.b64encode(IMAGE).decode()
    msgs: Any = [{"role": "user", "content": [
        {"type": "text", "text": ASK},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}]
    first = oa.chat.completions.create(model=VISION, messages=msgs, max_tokens=8,
                                       temperature=0)
    assert first.choices[0].message.content == want
    assert first.usage is not None and first.usage.prompt_tokens == prompt_tokens
    again = oa.chat.completions.create(model=VISION, messages=msgs, max_tokens=8,
                                       temperature=0)
    assert again.choices[0].message.content == want
    details = again.usage.prompt_tokens_details if again.usage else None
    assert details is not None and (details.cached_tokens or 0) > 0
    an = anthropic.Anthropic(base_url=node.url, api_key="k", max_retries=0, timeout=120)
    reply = an.messages.create(model=VISION, max_tokens=8, messages=[
        {"role": "user", "content": [
            {"type": "text", "text": ASK},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": data}}]}])
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) \
        == prompt_tokens
    ol = ollama.Client(host=node.url, timeout=120)
    chat = ol.chat(model=VISION, messages=[{"role": "user", "content": ASK,
                                            "images": [IMAGE]}],
                   options={"temperature": 0, "num_predict": 8})
    assert chat.done and chat.eval_count == 8
    text = oa.chat.completions.create(model=VISION, max_tokens=4, messages=[
        {"role": "user", "content": "Just text."}])
    assert text.choices[0].finish_reason == "length"
