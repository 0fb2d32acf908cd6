"""A jaccl (RDMA) launch whose group can't form falls back to the ring over TCP on the
same nodes and says so. Simulated: there is no RDMA here, so each Linux node reports a
Mac's Thunderbolt cabling and RDMA devices from recorded output (tests/fixtures/macos/
mesh3, through SHOAL_PLATFORM_RECORDING), which makes the jaccl placement pass the
owner's checks; MLX's jaccl backend then can't initialise on Linux, as it can't on a Mac
whose RDMA link is broken."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from nodes import NodeProcess, free_port, home_with
from tests_support import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")
MESH = Path(__file__).resolve().parents[1] / "fixtures" / "macos" / "mesh3"


def test_a_jaccl_group_that_cant_form_runs_over_the_ring_and_says_so(tmp_path,
                                                                    tiny_model_dir):
    ports = [free_port(), free_port()]
    nodes = []
    try:
        for i, mac in enumerate(("studio-a", "studio-b")):
            nodes.append(NodeProcess(
                home_with(tmp_path / mac, tiny_model_dir), "none",
                "--peer", f"127.0.0.1:{ports[1 - i]}", "--secret", "s",
                cluster_port=ports[i], env={"SHOAL_PLATFORM_RECORDING": str(MESH / mac)}))
        a, b = nodes
        for n in nodes:
            n.wait_healthy()
        idb = b.client.status().cluster.id

        def b_seen_with_rdma() -> bool:
            peers = a.client._call("GET", "/shoal/peers")
            return any(p.get("reachable") for p in peers) and bool(
                (a.client._call("GET", "/shoal/topology")["nodes"][1].get("platform")
                 or {}).get("rdma", {}).get("devices"))
        wait_until(b_seen_with_rdma, 30)

        r = httpx.post(a.url + "/shoal/instances", timeout=180, json={
            "model": "tiny-llama", "strategy": "pipeline", "backend": "jaccl",
            "nodes": [{"node": "self", "layers": [0, 2]}, {"node": idb, "layers": [2, 4]}]})
        assert r.status_code == 201, r.text
        warning = r.json()["warning"]
        assert "jaccl (RDMA) group didn't form" in warning, warning
        assert "ring (TCP) on the same nodes" in warning
        inst = a.client._call("GET", "/shoal/instances")["instances"][0]
        assert inst["state"] == "ready" and inst["warning"] == warning
        assert [x["node"] for x in inst["ranks"]][1] == idb
        done = a.client.complete([{"role": "user", "content": "Hi"}], model="tiny-llama",
                                 max_tokens=3)
        assert done["usage"]["completion_tokens"] == 3
    finally:
        for n in nodes:
            n.stop()
