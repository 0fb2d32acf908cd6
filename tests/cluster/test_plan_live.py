"""Planning on a live two-node cluster: the API and `shoal plan` rank placements from what
the nodes report, and a hand-made placement gets its prediction or the exact reason."""

from __future__ import annotations

import subprocess
import sys

import httpx

from nodes import ROOT, start_cluster
from tests_support import wait_until


def test_plan_api_and_cli_on_a_live_cluster(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("SHOAL_CALIBRATE", "1")  # the planner uses each node's measured speed
    a, b = start_cluster(tmp_path, tiny_model_dir, 2)
    try:
        def topo() -> dict:
            return a.client._call("GET", "/shoal/topology")
        wait_until(lambda: len(topo()["links"]) >= 2 and
                   all(n.get("speed") for n in topo()["nodes"]), 30)
        assert all(n["speed"]["memory_bandwidth_Bps"] > 1e8 for n in topo()["nodes"])
        # the rate a decoder layer's matmuls get, at two widths, for prefill predictions
        assert all(set(n["speed"]["prefill_flops"]) == {"512", "2048"} and
                   all(r > 1e8 for r in n["speed"]["prefill_flops"].values())
                   for n in topo()["nodes"])
        r = httpx.post(a.url + "/shoal/plan", json={"model": "tiny-llama", "context": 1024},
                       timeout=30)
        assert r.status_code == 200, r.text
        rep = r.json()
        assert rep["placements"], rep
        best = rep["placements"][0]
        assert best["decode_tps"] > 0 if "decode_tps" in best else best
        # Ranked for agents, with the prompt lengths and cached share the user gives.
        r = httpx.post(a.url + "/shoal/plan", timeout=30, json={
            "model": "tiny-llama", "context": 4096, "rank": "agents",
            "prompt_tokens": [500, 3000], "cached": 0.5})
        assert r.status_code == 200, r.text
        ttft = r.json()["placements"][0]["ttft"]
        assert [(x["prompt_tokens"], x["cached_tokens"]) for x in ttft] == [(500, 250),
                                                                          (3000, 1500)]
        assert 0 < ttft[0]["seconds"] < ttft[1]["seconds"]
        for body, param in (({"rank": "fast"}, "rank"), ({"prompt_tokens": 5}, "prompt_tokens"),
                            ({"prompt_tokens": [True]}, "prompt_tokens"),
                            ({"cached": 1}, "cached")):
            r = httpx.post(a.url + "/shoal/plan", json={"model": "tiny-llama", **body},
                           timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        # A hand-made pipeline split over both nodes: a prediction for it.
        ids = [a.client.status().cluster.id, b.client.status().cluster.id]
        one = httpx.post(a.url + "/shoal/plan", timeout=30, json={
            "model": "tiny-llama", "context": 1024, "strategy": "pipeline",
            "nodes": [{"node": ids[0], "layers": [0, 3]}, {"node": ids[1], "layers": [3, 4]}]})
        assert one.status_code == 200, one.text
        assert len(one.json()["placements"]) == 1
        bad = httpx.post(a.url + "/shoal/plan", timeout=30, json={
            "model": "tiny-llama", "strategy": "pipeline",
            "nodes": [{"node": ids[0], "layers": [0, 3]}, {"node": ids[1], "layers": [2, 4]}]})
        assert bad.status_code == 400 and "overlap" in bad.text
        cli = subprocess.run([sys.executable, "-m", "app.cli", "plan", "tiny-llama",
                              "--url", a.url, "--context", "1024"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert "pipeline" in cli.stdout or "tensor" in cli.stdout
    finally:
        a.stop()
        b.stop()


def test_catalog_fit_for_models_on_disk_comes_from_the_planner(tmp_path, tiny_model_dir):
    (a,) = start_cluster(tmp_path, tiny_model_dir, 1)
    try:
        r = httpx.get(a.url + "/shoal/hub/catalog", timeout=60)
        assert r.status_code == 200, r.text
        tiny = next(m for m in r.json()["models"] if m["id"] == "tiny-llama")
        assert tiny["fit_basis"] == "planner" and tiny["fits"] is True
        remote = [m for m in r.json()["models"] if not m.get("local")]
        assert remote and all(m["fit_basis"] == "size" for m in remote)
    finally:
        a.stop()
