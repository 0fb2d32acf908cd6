"""What a web page open in the user's browser could do to a node on 127.0.0.1, replayed
with real HTTP against a real node: cross-site "simple" POSTs (CSRF), a rebound DNS name
(Host header), preflights, and hostile bodies (huge, chunked, deep, NaN). Every refusal is
a clear error in the protocol's shape, and the node stays up."""

from __future__ import annotations

import httpx
import pytest

from nodes import NodeProcess

PAGE, EVIL = "http://localhost:3000", "http://evil.example"
SIMPLE = {"Content-Type": "text/plain", "Origin": EVIL}  # what a page's form/fetch sends


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProcess(tmp_path_factory.mktemp("browser-node"), "none", "--cors-origin", PAGE,
                    "--allowed-host", "shoal.lan", "--max-body-mb", "1")
    try:
        yield n.wait_healthy()
    finally:
        n.stop()


def alive(n: NodeProcess) -> bool:
    return n.proc.poll() is None and n.client.health().ok


def refused(r: httpx.Response, status: int = 403) -> str:
    assert r.status_code == status, r.text
    return r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/shoal/shutdown", "/shoal/unload", "/shoal/load",
                                  "/shoal/instances", "/shoal/replicas/stop", "/shoal/hub/pull",
                                  "/shoal/settings/secret", "/shoal/settings/hf-token"])
def test_simple_request_csrf_is_refused(node, path):
    r = httpx.post(node.url + path, content=b'{"model": "x"}', headers=SIMPLE)
    assert "can't be called from a web page" in refused(r)
    assert "access-control-allow-origin" not in r.headers
    assert alive(node)


def test_control_routes_are_closed_to_allowed_origins_too(node):
    r = httpx.post(node.url + "/shoal/shutdown", json={}, headers={"Origin": PAGE})
    assert "can't be called from a web page" in refused(r)
    r = httpx.post(node.url + "/shoal/settings/secret", json={}, headers={"Origin": PAGE})
    assert "can't be called from a web page" in refused(r)
    # a form posted from another site: browsers always say so in Sec-Fetch-Site
    for site in ("cross-site", "same-site"):
        r = httpx.post(node.url + "/shoal/unload", headers={"Sec-Fetch-Site": site})
        assert "web page" in refused(r)
    r = httpx.delete(node.url + "/shoal/models/some-model", headers={"Origin": PAGE})
    refused(r)
    assert alive(node)


def test_other_bodies_than_json_are_refused(node):
    # No Origin (a page that hides it, or curl -d): still no form or text body.
    r = httpx.post(node.url + "/shoal/shutdown", content=b"x=1",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert "Content-Type: application/json" in refused(r, 415)
    r = httpx.post(node.url + "/v1/chat/completions", content=b"{}",
                   headers={"Content-Type": "text/plain"})
    assert r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.post(node.url + "/api/chat", content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]  # Ollama's shape
    assert alive(node)


@pytest.mark.parametrize("path", ["/shoal/status", "/v1/models", "/api/tags", "/health"])
def test_dns_rebinding_host_is_refused(node, path):
    r = httpx.get(node.url + path, headers={"Host": f"evil.example:{node.port}"})
    message = refused(r) if path != "/api/tags" else r.json()["error"]
    assert r.status_code == 403 and "evil.example" in message and "--allowed-host" in message


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1:{port}", "localhost:{port}",
                                  "[::1]:{port}", "shoal.lan:{port}", "SHOAL.LAN"])
def test_own_names_are_served(node, host):
    r = httpx.get(node.url + "/shoal/status", headers={"Host": host.format(port=node.port)})
    assert r.status_code == 200


def test_pages_of_other_origins_get_nothing(node):
    pre = httpx.options(node.url + "/v1/chat/completions", headers={
        "Origin": EVIL, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert "--cors-origin" in refused(pre)
    assert "access-control-allow-origin" not in pre.headers
    r = httpx.get(node.url + "/v1/models", headers={"Origin": EVIL})
    refused(r)
    assert "access-control-allow-origin" not in r.headers
    # the allowed page: its preflight for a protocol route passes, for a control one not
    ok = httpx.options(node.url + "/v1/chat/completions", headers={
        "Origin": PAGE, "Access-Control-Request-Method": "POST"})
    assert ok.status_code == 204 and ok.headers["access-control-allow-origin"] == PAGE
    no = httpx.options(node.url + "/shoal/shutdown", headers={
        "Origin": PAGE, "Access-Control-Request-Method": "POST"})
    assert no.status_code == 403 and "access-control-allow-origin" not in no.headers
    r = httpx.get(node.url + "/v1/models", headers={"Origin": PAGE})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == PAGE


def test_anthropic_clients_get_their_error_shape(node):
    r = httpx.post(node.url + "/v1/messages", json={}, headers={"Origin": EVIL})
    body = r.json()
    assert r.status_code == 403 and body["type"] == "error"
    assert body["error"]["type"] == "permission_error"


def test_bodies_over_the_limit_are_refused_unread(node):
    big = b'{"model": "x", "messages": [], "pad": "' + b"a" * (2 * 2**20) + b'"}'
    r = httpx.post(node.url + "/v1/chat/completions", content=big,
                   headers={"Content-Type": "application/json"})
    assert "--max-body-mb" in refused(r, 413) and "1 MB" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: aiohttp's own limit stops it while reading
        for _ in range(20):
            yield b" " * 2**17
    r = httpx.post(node.url + "/api/chat", content=chunks(),
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "--max-body-mb" in r.json()["error"]  # Ollama's shape
    assert alive(node)


def test_deep_json_and_nan_are_a_400_naming_the_field(node):
    deep = b'{"model": "x", "messages": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    r = httpx.post(node.url + "/v1/chat/completions", content=deep,
                   headers={"Content-Type": "application/json"})
    assert "nests deeper" in refused(r, 400)
    r = httpx.post(node.url + "/v1/chat/completions",
                   content=b'{"model": "x", "messages": [], "temperature": NaN}',
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert alive(node)


def test_names_of_a_node_on_every_interface():
    import socket

    from engine.api.cors import host_name, host_names
    assert [host_name(h) for h in ("Shoal.LAN:8421", "[::1]:8421", "::1", "a.example.")] == \
        ["shoal.lan", "::1", "::1", "a.example"]
    everywhere = host_names("0.0.0.0", ["my.name"])
    me = socket.gethostname().lower()
    assert {"localhost", "my.name", me, f"{me.split('.')[0]}.local",
            "host.docker.internal"} <= everywhere  # and the address a request came in on
    assert "evil.example" not in everywhere
    assert host_names("192.168.1.5", []) == {"localhost", "127.0.0.1", "::1", "192.168.1.5"}


@pytest.mark.parametrize("header", [{"X-Forwarded-For": "203.0.113.9"},
                                    {"Forwarded": "for=203.0.113.9;proto=https"},
                                    {"X-Real-IP": "203.0.113.9"}, {"Via": "1.1 caddy"}])
def test_loopback_routes_refuse_what_came_through_a_proxy(node, header):
    """A reverse proxy on this machine connects from 127.0.0.1 for every client: what it
    forwards (Caddy adds X-Forwarded-For and Via itself; nginx as configured) may not
    shut the node down or read the cluster secret. Without the headers it may."""
    for path in ("/shoal/shutdown", "/shoal/settings/secret"):
        r = httpx.post(node.url + path, json={}, headers=header)
        assert "came through a proxy" in refused(r, 401)
    assert alive(node)
    assert httpx.post(node.url + "/shoal/settings/secret", json={}).status_code == 200
