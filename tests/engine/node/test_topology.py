"""GET /shoal/topology's body from this node and its peers: each kind of node entry keeps
the keys it had when the route merged dicts, in the same order, and a reader gets records
back that write the same JSON."""

from __future__ import annotations

import json
from pathlib import Path

from engine.cluster_records import TopologyInfo
from engine.node.peers import Peer
from engine.node.topology import topology_info
from engine.platform.probes import probe_platform, recorded_runner
from engine.records import NodeInfo, PeerLink

DOCK = Path(__file__).resolve().parents[2] / "fixtures" / "macos" / "dock"
NODE_KEYS = ["id", "name", "instances", "followers", "version", "mlx_version", "state",
             "models", "links", "machine", "speed", "platform", "power", "draft"]
PEER_KEYS = ["url", "id", "name", "version", "reachable", "trusted", "error", "warning",
             "link", "mlx_version", "seen_s_ago"]


def mac(name: str) -> dict:
    """A Mac's platform report from the recorded dock pair, as a peer sends it."""
    report = probe_platform(system="darwin", runner=recorded_runner(DOCK / name))
    return json.loads(json.dumps(report.to_json()))


def node(nid: str, name: str, to: str, platform: dict) -> NodeInfo:
    return NodeInfo.from_json({
        "id": nid, "name": name, "version": "1.0", "mlx_version": "0.30", "state": "idle",
        "models": ["m"],
        "links": [{"to": to, "url": "http://10.0.0.9:8422", "type": "thunderbolt",
                   "rtt_ms": 0.2, "bandwidth_MBps": 4000.0}],
        "machine": {"chip": "Apple M3 Ultra", "os_name": "macOS", "os_version": "26.2",
                    "memory": {"total_bytes": 512 * 2**30, "available_bytes": 464 * 2**30}},
        "speed": {"memory_bandwidth_Bps": 7e11},
        "platform": platform,
        "power": {"watts": 12.5, "source": "ioreport", "at": 1.0}})


def wire(record) -> dict:
    return json.loads(json.dumps(record.to_json()))


def test_every_kind_of_node_keeps_its_keys_and_a_reader_gets_the_same_json_back(monkeypatch):
    monkeypatch.setattr("engine.node.peers.time.monotonic", lambda: 100.0)
    me = node("a", "studio", "b", mac("studio"))
    mine = node("b", "macbook", "a", mac("macbook"))
    peers = [Peer("http://10.0.0.2:8422", id="b", name="macbook", version="1.0",
                  reachable=True, trusted=True, last_seen=95.0, info=mine,
                  link=PeerLink("thunderbolt", 0.25, 4100.0, at=90.0)),
             Peer("http://10.0.0.3:8422", reachable=True, last_seen=99.0,
                  error="not in this cluster: the signature doesn't match"),
             Peer("http://10.0.0.4:8422", discovered=True, error="Can't reach 10.0.0.4")]
    body = wire(topology_info(me, peers))

    here, peer, stranger, gone = body["nodes"]
    assert list(here) == NODE_KEYS + ["self", "reachable", "trusted"]
    assert list(peer) == NODE_KEYS + ["url", "reachable", "trusted", "error", "warning",
                                      "link", "seen_s_ago", "self"]
    assert list(stranger) == list(gone) == PEER_KEYS + ["self"]
    # the values the route's merged dicts had
    assert here == {**wire(me), "self": True, "reachable": True, "trusted": True}
    assert peer == {**wire(mine), **wire(peers[0].public()), "self": False}
    assert peer["seen_s_ago"] == 5.0 and peer["link"]["rtt_ms"] == 0.25
    assert stranger == {**wire(peers[1].public()), "self": False}
    assert body["links"] == [{"from": "a", **wire(me.links[0])},
                             {"from": "b", **wire(mine.links[0])}]
    assert [list(c) for c in body["thunderbolt"]] == [
        ["a", "b", "a_port", "b_port", "a_interface", "b_interface", "speed", "via", "type",
         "rdma", "why"]] * 2
    assert sorted((c["speed"], c["rdma"]) for c in body["thunderbolt"]) == [
        ("40 Gb/s", False), ("80 Gb/s", True)]

    got = TopologyInfo.from_json(body)
    a, b, c, d = got.nodes
    assert a.self and b.machine.memory.available_bytes == 464 * 2**30 and not b.self
    assert b.link.bandwidth_MBps == 4100.0 and b.platform.system == "macos"
    assert c.state is None and not c.trusted and d.error == "Can't reach 10.0.0.4"
    assert got.links[1].from_ == "b" and got.links[1].to == "a"
    assert {x.via for x in got.thunderbolt} == {None, "ThunderBay Flex 8"}
    assert json.dumps(got.to_json()) == json.dumps(body)  # byte for byte, keys in order
