"""CORS: off by default; with --cors-origin (repeatable) only those origins get answers to a
preflight and the Access-Control-Allow-Origin header on every route, streamed ones too; a
page of any other origin is refused outright (tests/engine/node/test_browser_attacks.py)."""

from __future__ import annotations

import httpx
import pytest

from nodes import NodeProcess

PAGE, OTHER = "http://localhost:3000", "http://evil.example"


def preflight(url: str, origin: str) -> httpx.Response:
    return httpx.options(url + "/v1/chat/completions", timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


@pytest.fixture(scope="module")
def cors_node(tmp_path_factory):
    node = NodeProcess(tmp_path_factory.mktemp("cors-node"), "none", "--cors-origin", PAGE,
                       "--cors-origin", "http://127.0.0.1:8080")
    try:
        yield node.wait_healthy()
    finally:
        node.stop()


def test_off_by_default(tiny_node):
    r = preflight(tiny_node.url, PAGE)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert "--cors-origin" in r.json()["error"]["message"]
    r = httpx.get(tiny_node.url + "/v1/models", headers={"Origin": PAGE})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert httpx.get(tiny_node.url + "/v1/models").status_code == 200  # no page, no Origin


def test_allowed_origins_only(cors_node):
    ok = preflight(cors_node.url, PAGE)
    assert ok.status_code == 204
    assert ok.headers["access-control-allow-origin"] == PAGE
    assert "POST" in ok.headers["access-control-allow-methods"]
    assert "authorization" in ok.headers["access-control-allow-headers"]
    assert preflight(cors_node.url, "http://127.0.0.1:8080").status_code == 204
    assert preflight(cors_node.url, OTHER).status_code == 403
    r = httpx.get(cors_node.url + "/api/tags", headers={"Origin": PAGE})
    assert r.headers["access-control-allow-origin"] == PAGE
    r = httpx.get(cors_node.url + "/api/tags", headers={"Origin": OTHER})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    err = httpx.post(cors_node.url + "/v1/chat/completions", json={}, headers={"Origin": PAGE})
    assert err.status_code == 400 and err.headers["access-control-allow-origin"] == PAGE
