"""Every route of a live node, fed hypothesis-generated path parameters, queries and JSON
bodies: the user API's control routes as the app would call them, and the cluster port's
peer routes as a member would (signed: a member's bug or a member gone bad). No answer is
a 5xx, the node keeps serving, and its worker is the same live process afterwards.
(The wire protocols' routes are fuzzed from /openapi.json in test_openapi_fuzz.py.)"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from members import Member
from nodes import NodeProcess, home_with

SECRET = "fuzz-secret"
EXAMPLES = 25  # per route
SKIP = {("POST", "/shoal/shutdown"),  # obeyed, as it should be: the node then stops
        ("GET", "/shoal/events")}  # a stream that never ends (it is read by the app tests)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64) | st.floats(allow_nan=False)
    | st.text(max_size=40) | st.sampled_from(["../../etc/passwd", "/tmp/x", "tiny-llama",
                                              "a" * 5000, "-1", "1e400", "\u0000"]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids,
                                                              max_size=4),
    max_leaves=12)
# bodies shaped like the records the routes expect, with hostile values in their fields
record_keys = ["instance", "model", "host", "owner", "config", "reason", "address", "repo",
               "revision", "layers", "nodes", "strategy", "rotate", "context_limit",
               "rank", "world", "bells", "hosts", "kv_bits", "token", "lanes"]
bodies = json_values | st.dictionaries(st.sampled_from(record_keys), json_values,
                                       max_size=6)
segment = st.text(max_size=30) | st.sampled_from(["..", "%2e%2e", "a/../../b", "x" * 3000])


def _routes() -> list[tuple[str, str, bool]]:
    """(method, path pattern, peer route?) for every route a node serves."""
    from engine.node import cluster_routes, hub_routes, plan_routes, server, settings_routes
    out = []
    for table in (server.routes, cluster_routes.routes, hub_routes.routes,
                  hub_routes.peer_routes, plan_routes.routes, settings_routes.routes):
        for r in table:
            method, path = r.method, r.path  # type: ignore[attr-defined]
            if (method, path) not in SKIP and method != "HEAD":
                out.append((method, path, server.is_peer_route(path)))
    return out


ROUTES = _routes()


def _fill(pattern: str, values: list[str]) -> str:
    it = iter(values)
    return re.sub(r"\{[^}]+\}", lambda m: quote(next(it, "x"), safe=""), pattern)


@pytest.fixture(scope="module")
def node(tmp_path_factory, tiny_model_dir):
    n = NodeProcess(home_with(tmp_path_factory.mktemp("fuzz-node"), tiny_model_dir),
                    "tiny-llama", "--secret", SECRET, "--no-heal")
    try:
        n.wait_healthy().wait_ready()
        yield n
    finally:
        n.stop()


def test_the_route_list_is_whole():
    paths = {p for _, p, _ in ROUTES}
    assert {"/shoal/peer/start", "/shoal/peer/files/{owner}/{name}/{revision}/{path:.+}",
            "/shoal/instances", "/shoal/hub/pull", "/shoal/settings/secret"} <= paths


@pytest.mark.parametrize("method,pattern,peer", ROUTES,
                         ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_no_body_makes_a_route_fail(node, method, pattern, peer):
    pid = node.client.status().worker_pid
    member = Member(node.cluster_url, SECRET) if peer else None
    statuses: list[int] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(params=st.lists(segment, min_size=4, max_size=4), body=bodies,
           query=st.dictionaries(st.sampled_from(["bytes", "repo", "model", "since", "q"]),
                                 st.text(max_size=20), max_size=2))
    def fuzz(params, body, query):
        path = _fill(pattern.replace(":.+}", "}"), params)
        if query:
            path += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
        data = None if method in ("GET", "DELETE") else body
        if member is not None:
            r = member.send(method, path, data)
        else:
            r = httpx.request(method, node.url + path, timeout=60,
                              content=None if data is None else json.dumps(data),
                              headers={"Content-Type": "application/json"})
        assert r.status_code < 500, (method, path, data, r.status_code, r.text[:500])
        statuses.append(r.status_code)

    try:
        fuzz()
    finally:
        if member is not None:
            member.http.close()
    assert node.proc.poll() is None and node.client.health().ok
    # the bodies reached the routes: not every request was refused at the door
    assert any(code != 401 for code in statuses), statuses
    status = node.client.status()
    if pid is not None and status.worker_pid is not None:  # a launch may switch the model
        assert status.worker_pid == pid or status.model != "tiny-llama", node.tail()
