"""A model name from a client becomes a path under the models folder or the Hugging Face
cache. One that can't be a model (100,000 characters, a NUL, a path) was an OSError: a 500
whose message showed the models folder's absolute path. Now it is refused before it
touches the disk: a 400 naming the field, with a short message and no path of this
machine. Tested on the functions and through the node's own app (aiohttp's test client:
a real node process adds nothing here)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.errors import BadRequest, CorruptModel, ModelNotFound
from engine.hub.catalog import remove_model
from engine.hub.local import find_local_model

LONG = "a" * 100_000
BAD = [LONG, "a" * 300, "x\x00y", "../../etc", "a/b/c", "/abs", "a\\b", ".hidden",
       "é" * 150]


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    (tmp_path / "models" / "broken").mkdir(parents=True)  # no config.json
    return tmp_path


def _node(where: Path) -> Any:
    from engine.node.service import Node
    return Node(where / "home", where / "models")


@pytest.mark.parametrize("name", BAD)
def test_a_name_no_model_can_have_is_no_model_and_touches_no_disk(where: Path,
                                                                   name: str) -> None:
    assert find_local_model(where / "models", name, where / "hf") is None


@pytest.mark.parametrize("name", BAD)
def test_resolve_refuses_it_naming_the_field_without_a_path(where: Path, name: str) -> None:
    with pytest.raises(BadRequest) as e:
        _node(where).resolve(name)
    assert e.value.param == "model" and e.value.status == 400
    assert len(e.value.message) < 300 and str(where) not in e.value.message
    with pytest.raises(BadRequest) as e:
        remove_model(where / "models", name)
    assert e.value.param == "model" and str(where) not in e.value.message


def test_a_broken_or_missing_model_is_named_without_the_folders_path(where: Path) -> None:
    with pytest.raises(CorruptModel) as e:
        _node(where).resolve("broken")
    assert "broken has no config.json" in e.value.message
    assert str(where) not in e.value.message
    with pytest.raises(ModelNotFound) as e:
        _node(where).resolve("no-such-model")
    assert str(where) not in e.value.message


ROUTES = [
    ("POST", "/v1/chat/completions",
     {"model": LONG, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ("POST", "/v1/completions", {"model": LONG, "prompt": "hi"}, "model"),
    ("POST", "/shoal/load", {"model": LONG}, "model"),
    ("POST", "/shoal/load", {"model": "x\x00y"}, "model"),
    ("POST", "/shoal/hub/pull", {"repo": LONG}, "repo"),
    ("POST", "/shoal/hub/pull", {"repo": "o/n", "revision": "../main"}, "revision"),
    ("POST", "/shoal/hub/pull", {"repo": "../../etc/x"}, "repo"),
    ("DELETE", "/shoal/models/" + "a" * 7000, None, "model"),
    ("DELETE", "/shoal/models/a%2F..%2F..%2Fb", None, "model"),
    ("PUT", "/shoal/models/" + "a" * 7000 + "/settings", {"context_limit": None}, "model"),
]


def test_the_routes_answer_400_naming_the_field(where: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from engine.node.server import build_app

    async def run() -> list[tuple[int, dict[str, Any], str]]:
        out = []
        async with TestClient(TestServer(build_app(_node(where)))) as client:
            for method, path, body, _ in ROUTES:
                r = await client.request(method, path, json=body)
                out.append((r.status, await r.json(), await r.text()))
        return out

    for (status, body, text), (method, path, _, param) in zip(asyncio.run(run()), ROUTES):
        assert status == 400, (method, path[:40], text[:300])
        assert body["error"]["param"] == param
        assert len(text) < 600 and str(where) not in text
