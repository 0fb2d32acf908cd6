"""Healing a split dragged by hand, through real nodes on loopback: three machines (mac-a,
whose node owns the model, mac-b and mac-c) run tiny-llama split by layers as the user
placed it. mac-a is slow (its recorded speed says so), so once a node is lost the planner
puts the model on one fast machine that isn't mac-a: a launch handed over to another node.

That hand-over used to drop the layers, and the node it went to refused it ("nodes[0]
needs 'layers': [start, end] for pipeline"): the model stayed down. Now mac-c is killed
(SIGKILL) and the model runs again on mac-b alone; mac-c comes back and the user's own
split is offered and runs again (the copy healing put on mac-b is stopped, not left
holding memory); then mac-b quits politely (SIGTERM), tells mac-a it is
leaving, and the model runs again on mac-c. Every sentence names machines, not node ids."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

import httpx
import pytest

from engine.records import RunnerReady
from nodes import NodeProcess, start_cluster
from tests_support import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")

NAMES = ("mac-a", "mac-b", "mac-c")
SLOW = {"memory_bandwidth_Bps": 1e8, "compute_flops": 1e9, "attention_flops": 1e9,
        "prefill_flops": {"512": 1e9, "2048": 1e9}}
FAST = {"memory_bandwidth_Bps": 1e11, "compute_flops": 1e12, "attention_flops": 1e12,
        "prefill_flops": {"512": 1e12, "2048": 1e12}}


def named_homes(root, speeds: list[dict]) -> list[str]:
    """Each node's id and name, and the speed its calibration recorded (read, not run)."""
    from engine.telemetry.calibrate import VERSION
    from engine.telemetry.memory import machine_info
    m = machine_info()
    ids = []
    for i, (name, speed) in enumerate(zip(NAMES, speeds)):
        home = root / f"node{i}" / "home"
        home.mkdir(parents=True)
        ids.append(f"{name[-1]}0000000000{i}")
        (home / "node.json").write_text(json.dumps({"id": ids[-1], "name": name}))
        (home / "calibration.json").write_text(json.dumps(
            {**speed, "key": f"{m.chip}|{m.mlx_version}|{VERSION}"}))
    return ids


def healing(n: NodeProcess) -> dict:
    return n.client._call("GET", "/shoal/instances").get("healing") or {}


def chat(n: NodeProcess, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(n.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": max_tokens, "temperature": 0})


def healed(a: NodeProcess) -> dict:
    wait_until(lambda: healing(a).get("state") in ("serving", "doesnt_fit", "failed"), 90)
    return healing(a)


def plain(text: str, ids: list[str]) -> None:
    """A sentence for a person: machine names, no node ids, ranks or API routes."""
    assert not any(i in text for i in ids) and "rank" not in text and "/shoal" not in text, \
        text


def test_a_hand_split_heals_after_a_kill_and_after_a_polite_quit(
        tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("SHOAL_CALIBRATE", "1")  # the recorded speeds are read
    ids = named_homes(tmp_path, [SLOW, FAST, FAST])
    nodes = start_cluster(tmp_path, tiny_model_dir, 3)
    a, b, c = nodes
    try:
        assert [n.client.status().cluster.id for n in nodes] == ids
        wait_until(lambda: all(n.get("speed") for n in
                               a.client._call("GET", "/shoal/topology")["nodes"]), 30)
        split = {"model": "tiny-llama", "strategy": "pipeline",
                 "nodes": [{"node": "self", "layers": [0, 2]},
                           {"node": ids[1], "layers": [2, 3]},
                           {"node": ids[2], "layers": [3, 4]}]}
        r = httpx.post(a.url + "/shoal/instances", json=split, timeout=120)
        assert r.status_code == 201, r.text
        assert chat(a).status_code == 200

        # mac-c is killed in the middle of an answer
        failed: list[str] = []
        t = threading.Thread(target=lambda: failed.append(chat(a, 100_000).text))
        t.start()
        wait_until(lambda: a.client.status().state == "generating", 30)
        c.proc.send_signal(signal.SIGKILL)
        t.join(60)
        message = json.loads(failed[0])["error"]["message"]
        assert "placing tiny-llama again on the machines that remain" in message, message
        assert "/shoal" not in message, message

        info = healed(a)
        assert info["state"] == "serving", info
        assert info["lost"] == [ids[2]] and info["lost_names"] == ["mac-c"]
        assert info["on_names"] == ["mac-b"] and not info["left"], info
        assert "is running again without mac-c, on mac-b" in info["message"], info
        plain(info["message"], ids)
        wait_until(lambda: chat(b).status_code == 200, 30)

        # mac-c is back: the user's own split is offered, and runs as before
        nodes[2] = c = NodeProcess(c.home, "none", *c.extra, port=c.port,
                                   cluster_port=c.cluster_port).wait_healthy()
        wait_until(lambda: healing(a).get("back"), 40)
        assert "mac-c is back" in healing(a)["message"]
        original = healing(a)["original"]
        assert [n["layers"] for n in original["nodes"]] == [[0, 2], [2, 3], [3, 4]]
        r = httpx.post(a.url + "/shoal/instances", json=original, timeout=120)
        assert r.status_code == 201, r.text
        assert [x["node"] for x in r.json()["ranks"]] == ids
        assert healing(a) == {}
        # the copy healing put on mac-b alone is gone: its memory isn't held twice
        assert not isinstance(b.client.status().runner, RunnerReady)
        assert chat(a).status_code == 200

        # mac-b quits politely: it tells mac-a, which places the model again at once
        quit_at = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: healing(a).get("lost") == [ids[1]], 30)
        noticed = time.monotonic() - quit_at
        info = healed(a)
        assert info["state"] == "serving" and info["left"], info
        assert info["on_names"] == ["mac-c"], info
        assert "is running again without mac-b, on mac-c" in info["message"], info
        plain(info["message"], ids)
        wait_until(lambda: chat(c).status_code == 200, 30)

        # Stop on the owner (the app's Stop: unload) ends the copy healing put on mac-c
        a.client.unload()
        assert healing(a) == {}
        assert not isinstance(c.client.status().runner, RunnerReady)
        print(f"\nhealing a hand split: mac-b's quit noticed in {noticed:.1f} s; served "
              f"again {info['seconds']:.1f} s after")
    finally:
        for n in nodes:
            n.stop()
