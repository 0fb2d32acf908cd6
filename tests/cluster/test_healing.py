"""Healing: a model over 3 loopback nodes loses one to kill -9 and is placed again on the
2 left. It doesn't fit on one: every node's --memory-limit is set between what one node
alone and what each of two would need, as the planner counts them. Clients send through
every node; the request in flight fails saying what happens next, the next ones are
served again; when the node returns, the original placement is offered and launches."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import httpx
import pytest

from nodes import NodeProcess, memory_limit_gb, start_cluster
from tests_support import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")

HELLO = [{"role": "user", "content": "Hello from a healing cluster"}]


def healing(a: NodeProcess) -> dict:
    return a.client._call("GET", "/shoal/instances").get("healing") or {}


def chat(n: NodeProcess, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(n.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "messages": HELLO, "max_tokens": max_tokens,
        "temperature": 0})


def test_a_node_killed_under_load_and_the_model_is_placed_again_on_the_rest(
        tmp_path, tiny_model_dir):
    limit = memory_limit_gb(tiny_model_dir)
    nodes = start_cluster(tmp_path, tiny_model_dir, 3,
                          extra=("--memory-limit", f"{limit:.6f}"))
    a, b, c = nodes
    ids = [n.client.status().cluster.id for n in nodes]
    try:
        body = {"model": "tiny-llama", "strategy": "pipeline",
                "nodes": [{"node": "self", "layers": [0, 2]},
                          {"node": ids[1], "layers": [2, 3]},
                          {"node": ids[2], "layers": [3, 4]}]}
        r = httpx.post(a.url + "/shoal/instances", json=body, timeout=120)
        assert r.status_code == 201, r.text
        # one node alone can't hold it: the planner says so
        alone = httpx.post(a.url + "/shoal/plan", timeout=30, json={
            "model": "tiny-llama", "strategy": "pipeline", "nodes": [ids[0]]})
        assert alone.status_code == 507, alone.text
        assert all(chat(n).status_code == 200 for n in nodes)

        # a long answer in flight through node b when node c dies
        failed: list[str] = []

        def in_flight() -> None:
            r = chat(b, max_tokens=100_000)
            failed.append(r.text)
        t = threading.Thread(target=in_flight)
        t.start()
        time.sleep(1.5)
        killed = time.monotonic()
        os.killpg(c.proc.pid, signal.SIGKILL)
        t.join(30)
        assert failed and "error" in json.loads(failed[0]), failed
        message = json.loads(failed[0])["error"]["message"]
        assert "placing tiny-llama again on the machines that remain" in message, message

        # served again through both nodes left, on both of them
        wait_until(lambda: healing(a).get("state") in ("serving", "doesnt_fit", "failed"),
                   60)
        info = healing(a)
        assert info["state"] == "serving", info
        assert info["lost"] == [ids[2]]
        for n in (a, b):
            wait_until(lambda n=n: chat(n).status_code == 200, 30)
        serving_again = time.monotonic() - killed
        inst = a.client._call("GET", "/shoal/instances")["instances"][0]
        assert inst["state"] == "ready" and [x["node"] for x in inst["ranks"]] == ids[:2]
        print(f"\nhealing: node killed -> serving on the 2 left in {serving_again:.1f} s "
              f"(the owner's own count: {info['seconds']:.1f} s from noticing)")
        assert serving_again < 40

        # the node comes back: the original placement is offered, and runs again
        nodes[2] = c = NodeProcess(c.home, "none", *c.extra, port=c.port,
                                   cluster_port=c.cluster_port).wait_healthy()
        wait_until(lambda: healing(a).get("back"), 30)
        original = healing(a)["original"]
        assert [n["node"] for n in original["nodes"]] == ids
        assert [n["layers"] for n in original["nodes"]] == [[0, 2], [2, 3], [3, 4]]
        r = httpx.post(a.url + "/shoal/instances", json=original, timeout=120)
        assert r.status_code == 201, r.text
        assert healing(a) == {}  # the user's launch: healing's record is done
        assert all(chat(n).status_code == 200 for n in nodes)
    finally:
        for n in nodes:
            n.stop()


def test_with_healing_off_a_failed_instance_stays_down_and_says_so(tmp_path, tiny_model_dir):
    a, b = start_cluster(tmp_path, tiny_model_dir, 2, extra=("--no-heal",))
    try:
        ids = [n.client.status().cluster.id for n in (a, b)]
        r = httpx.post(a.url + "/shoal/instances", timeout=120, json={
            "model": "tiny-llama", "strategy": "pipeline",
            "nodes": [{"node": "self", "layers": [0, 2]}, {"node": ids[1], "layers": [2, 4]}]})
        assert r.status_code == 201, r.text
        os.killpg(b.proc.pid, signal.SIGKILL)
        wait_until(lambda: healing(a).get("state") == "off", 20)
        assert "--no-heal" in healing(a)["message"]
        r = chat(a)
        assert r.status_code >= 500 and "Launch it again" in r.json()["error"]["message"]
    finally:
        a.stop()
        b.stop()
