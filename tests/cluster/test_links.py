"""Link measurement between nodes, and version warnings."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from engine.node.peers import incompatibility
from engine.records import NodeInfo, PeerInfo, PeerLink
from nodes import start_cluster
from tests_support import wait_until


def test_loopback_link_is_measured(tmp_path, tiny_model_dir):
    a, b = start_cluster(tmp_path, tiny_model_dir, 2)
    try:
        def link() -> PeerLink:
            return a.client.peers()[0].link
        wait_until(lambda: link().measured, 15)
        lk = link()
        assert lk.type == "loopback"
        assert 0 < lk.rtt_ms < 50          # a local HTTP round trip
        assert lk.bandwidth_MBps > 20      # loopback moves far more than this
    finally:
        a.stop()
        b.stop()


def test_incompatible_versions_are_named():
    from engine import __version__
    assert incompatibility(NodeInfo("b", version=__version__)) is None
    why = incompatibility(NodeInfo("b", version="99.0.0"))
    assert why and "Shoal 99.0.0" in why
    from engine.telemetry.versions import mlx_version
    why = incompatibility(NodeInfo("b", version=__version__, mlx_version="0.1.0"))
    assert why and "MLX 0.1.0" in why and (mlx_version() or "") in why


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None,
                    reason="needs root and tc to shape a veth link")
def test_added_delay_shows_in_the_measured_latency(tmp_path):
    """Two nodes joined by a veth pair (one end in a namespace of the test's own) whose
    egress is delayed 40 ms by netem: the measured round trip grows by that much."""
    import random
    import sys

    import httpx

    from nodes import ROOT

    tag, net = f"shl{random.randint(0, 9999)}", f"10.234.{random.randint(1, 250)}"
    ns, va, vb = f"{tag}ns", f"{tag}a", f"{tag}b"

    def sh(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    procs = []
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb, "netns", ns)
        sh("ip", "addr", "add", f"{net}.1/24", "dev", va)
        sh("ip", "link", "set", va, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", vb)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", vb, "up")
        r = sh("tc", "qdisc", "add", "dev", va, "root", "netem", "delay", "40ms")
        if r.returncode != 0:
            pytest.skip(f"this kernel has no netem qdisc: {r.stderr.strip()}")
        env = {**os.environ, "SHOAL_KEYRING": "0"}
        for i, prefix in ((1, []), (2, ["ip", "netns", "exec", ns])):
            other = f"{net}.{3 - i}:8422"
            procs.append(subprocess.Popen(
                [*prefix, sys.executable, "-m", "engine.cli", "node", "--host", f"{net}.{i}",
                 "--port", "8421", "--home", str(tmp_path / f"h{i}"), "--model", "none",
                 "--api-key", "k", "--secret", "s", "--peer", other,
                 "--cluster-host", f"{net}.{i}"],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))

        def link() -> PeerLink:
            try:
                peers = httpx.get(f"http://{net}.1:8421/shoal/peers", timeout=5,
                                  headers={"Authorization": "Bearer k"}).json()
                return PeerInfo.from_json(peers[0]).link
            except (httpx.HTTPError, IndexError, KeyError):
                return PeerLink()
        wait_until(lambda: link().measured, 60)
        assert link().rtt_ms >= 40
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
            p.wait(10)
        sh("ip", "link", "del", va)
        sh("ip", "netns", "del", ns)


def test_topology_lists_nodes_with_their_facts_and_links(tmp_path, tiny_model_dir):
    a, b = start_cluster(tmp_path, tiny_model_dir, 2)
    try:
        def topo() -> dict:
            return a.client._call("GET", "/shoal/topology")
        wait_until(lambda: len(topo()["links"]) >= 2 and
                   all(n.get("machine") for n in topo()["nodes"]), 20)
        t = topo()
        me, other = t["nodes"]
        assert me["self"] and not other["self"] and other["trusted"]
        for n in (me, other):
            m = n["machine"]
            assert m["memory"]["total_bytes"] > 0 and m["memory"]["available_bytes"] > 0
            assert m["os_name"] and m["mlx_version"] and m["mlx_backend"] == "cpu"
            assert "tiny-llama" in n["models"]
            power = n["power"]
            assert power["watts"] is not None or power["unavailable"]  # a reason, not silence
        pairs = {(lk["from"], lk["to"]) for lk in t["links"]}
        assert (me["id"], other["id"]) in pairs and (other["id"], me["id"]) in pairs
        assert all(lk["type"] == "loopback" and lk["rtt_ms"] > 0 for lk in t["links"])
    finally:
        a.stop()
        b.stop()
