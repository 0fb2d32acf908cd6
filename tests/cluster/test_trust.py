"""Trust between nodes: only nodes holding the cluster secret can call the control API,
and a node with another secret is shown as "not in this cluster"."""

from __future__ import annotations

import json

import httpx

from engine.cluster.auth import sign
from nodes import start_cluster
from tests_support import wait_until


def test_nodes_with_another_secret_are_not_in_the_cluster(tmp_path, tiny_model_dir):
    a, b = start_cluster(tmp_path / "one", tiny_model_dir, 2, secret="secret-one")
    (stranger,) = start_cluster(tmp_path / "two", tiny_model_dir, 1, secret="secret-two")
    try:
        httpx.post(a.url + "/shoal/peers", json={"address": f"127.0.0.1:{stranger.cluster_port}"},
                   timeout=10).raise_for_status()

        def view() -> dict:
            return {p["url"]: p for p in a.client._call("GET", "/shoal/peers")}
        wait_until(lambda: view()[stranger.cluster_url]["error"] is not None, 10)
        peers = view()
        assert peers[b.cluster_url]["trusted"] is True
        assert peers[stranger.cluster_url]["trusted"] is False
        assert "not in this cluster" in peers[stranger.cluster_url]["error"]
        # It can't be placed, and it can't drive a's workers.
        sid = f"127.0.0.1:{stranger.cluster_port}"  # its id is private to its own cluster
        r = httpx.post(a.url + "/shoal/instances", timeout=30, json={
            "model": "tiny-llama", "strategy": "pipeline",
            "nodes": [{"node": "self", "layers": [0, 2]}, {"node": sid, "layers": [2, 4]}]})
        assert r.status_code == 400 and "not in this cluster" in r.json()["error"]["message"]
    finally:
        for n in (a, b, stranger):
            n.stop()


def test_control_requests_need_a_fresh_valid_signature(tmp_path, tiny_model_dir):
    (a,) = start_cluster(tmp_path, tiny_model_dir, 1, secret="the-secret")
    try:
        body = json.dumps({"instance": "x", "model": "tiny-llama"}).encode()
        path = "/shoal/peer/prepare"

        def post(headers: dict) -> httpx.Response:
            return httpx.post(a.url + path, content=body, timeout=10,
                              headers={"Content-Type": "application/json", **headers})

        unsigned = post({})
        assert unsigned.status_code == 401
        assert unsigned.json()["error"]["code"] == "not_in_cluster"
        wrong = post(sign("another-secret", "intruder", "POST", path, body))
        assert wrong.status_code == 401 and "another cluster secret" in wrong.text
        stale = post(sign("the-secret", "n", "POST", path, body, now=1_000_000.0))
        assert stale.status_code == 401 and "clock" in stale.text
        good = sign("the-secret", "n", "POST", path, body)
        ports = post(good)
        assert ports.status_code == 200 and sorted(ports.json()) == ["host", "ports"]
        assert len(ports.json()["ports"]) == 2  # MLX's ring and the doorbell
        replay = post(good)
        assert replay.status_code == 401 and "replay" in replay.text
        tampered = sign("the-secret", "n", "POST", path, b"{}")
        assert post(tampered).status_code == 401  # signature covers the body
        # A signed body another version wrote, lacking a field: a 400 saying which.
        old = json.dumps({"instance": "x"}).encode()
        r = httpx.post(a.url + path, content=old, timeout=10, headers={
            "Content-Type": "application/json", **sign("the-secret", "n", "POST", path, old)})
        assert r.status_code == 400 and "'model'" in r.json()["error"]["message"]
        assert "update both nodes" in r.json()["error"]["message"]
        # A peer route can't be read without the secret either (it lists models, instances).
        assert httpx.get(a.url + "/shoal/node", timeout=10).status_code == 401
        # The cluster port serves nothing unsigned, not even the user API.
        for route in ("/v1/models", "/shoal/status"):
            assert httpx.get(a.cluster_url + route, timeout=10).status_code == 401
    finally:
        a.stop()
