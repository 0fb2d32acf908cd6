"""A per-model context limit: the user caps a model below what it declares; every model
listing (OpenAI, Anthropic, Ollama) and the planner use it at once, the worker enforces it
from its next load, it survives a node restart, and bad values are a 400 naming the
field."""

from __future__ import annotations

import httpx
import pytest

from nodes import NodeProcess, home_with


@pytest.fixture()
def node(tmp_path, tiny_model_dir):
    n = NodeProcess(home_with(tmp_path, tiny_model_dir), "tiny-llama").wait_healthy()
    n.wait_ready()
    yield n
    n.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory, tiny_model_dir):
    """One node for the refusals, which change nothing."""
    n = NodeProcess(home_with(tmp_path_factory.mktemp("settings"), tiny_model_dir),
                    "none").wait_healthy()
    yield n
    n.stop()


def put(n: NodeProcess, body, model: str = "tiny-llama") -> httpx.Response:
    return httpx.put(f"{n.url}/shoal/models/{model}/settings", json=body, timeout=60)


def contexts(n: NodeProcess) -> dict[str, int]:
    openai = httpx.get(n.url + "/v1/models", timeout=30).json()["data"][0]
    anthropic = httpx.get(n.url + "/v1/models", timeout=30,
                          headers={"anthropic-version": "2023-06-01"}).json()["data"][0]
    show = httpx.post(n.url + "/api/show", json={"model": "tiny-llama"}, timeout=30).json()
    plan = httpx.post(n.url + "/shoal/plan", json={"model": "tiny-llama"}, timeout=30).json()
    return {"openai": openai["shoal"]["context_length"],
            "anthropic": anthropic["max_input_tokens"],
            "ollama": show["model_info"]["llama.context_length"], "plan": plan["context"]}


def test_a_context_limit_is_listed_planned_and_enforced(node):
    declared = contexts(node)["openai"]
    r = put(node, {"context_limit": 600})
    assert r.status_code == 200, r.text
    assert r.json() == {"model": "tiny-llama", "context_limit": 600, "context_length": 600,
                        "declared_context": declared, "applies": "next load"}
    assert contexts(node) == {"openai": 600, "anthropic": 600, "ollama": 600, "plan": 600}
    long = [{"role": "user", "content": "word " * 700}]  # > 600 tokens, < what it declares
    httpx.post(node.url + "/shoal/unload", timeout=60)
    r = httpx.post(node.url + "/v1/chat/completions", timeout=120, json={
        "model": "tiny-llama", "messages": long, "max_tokens": 4})
    assert r.status_code == 400 and "prompt is too long" in r.text and "600" in r.text
    node.stop()
    again = NodeProcess(node.home, "tiny-llama").wait_healthy()  # kept in the node's home
    try:
        assert contexts(again)["openai"] == 600
        assert put(again, {"context_limit": None}).json()["context_length"] == declared
        assert contexts(again)["openai"] == declared
    finally:
        again.stop()


@pytest.mark.parametrize("body,param", [
    ({"context_limit": 10}, "context_limit"), ({"context_limit": "600"}, "context_limit"),
    ({"context_limit": 10**9}, "context_limit"), ({"context_limit": True}, "context_limit"),
    ({"context": 600}, "context")])
def test_bad_settings_are_a_400_naming_the_field(shared, body, param):
    r = put(shared, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_model_that_isnt_here_is_a_404(shared):
    assert put(shared, {"context_limit": 600}, model="nowhere").status_code == 404
