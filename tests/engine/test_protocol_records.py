"""The node's JSON shapes as records: what the node writes, engine.client reads back as the
same values, with states the GUI can match on; on the wire the states stay plain strings."""

from __future__ import annotations

import json

from engine.protocol import (
    ClusterInfo,
    DownloadInfo,
    DownloadState,
    FollowerInfo,
    InstanceInfo,
    InstanceState,
    RankInfo,
)


def wire(record):
    return json.loads(json.dumps(record.to_json()))


def test_an_instance_goes_over_the_wire_and_back():
    inst = InstanceInfo("a1", "tiny", "pipeline", InstanceState.READY, None,
                        [RankInfo(0, "n0", [0, 2], [2, 2], {"files": 1}),
                         RankInfo(1, "n1", [2, 4])])
    body = wire(inst)
    assert body["state"] == "ready" and body["reason"] is None and "warning" not in body
    assert body["ranks"][1] == {"rank": 1, "node": "n1", "layers": [2, 4], "progress": None,
                                "loaded": None}
    back = InstanceInfo.from_json(body)
    assert back == inst and back.state is InstanceState.READY
    # dict-style readers (the GUI's older code) see the same values
    assert back["ranks"][0]["loaded"]["files"] == 1 and back.get("warning") is None


def test_a_single_node_launch_has_no_id_and_a_newer_nodes_keys_are_dropped():
    body = wire(InstanceInfo(None, "tiny", "single", InstanceState.READY, None,
                             [RankInfo(0, "n0")]))
    assert "id" not in body
    back = InstanceInfo.from_json({**body, "added_later": 1, "warning": "tight"})
    assert back.id is None and back.warning == "tight"


def test_a_cluster_and_its_followers():
    c = ClusterInfo("n0", "box", [], [FollowerInfo("a1", 1, InstanceState.FAILED, "gone",
                                                    [1, 2])])
    back = ClusterInfo.from_json(wire(c))
    assert back == c and back.followers[0].state in (InstanceState.FAILED,
                                                     InstanceState.STOPPED)


def test_a_download():
    d = DownloadInfo("d1", "o/m", "main", None, DownloadState.CANCELLED, started=1.5)
    body = wire(d)
    assert body["state"] == "cancelled" and body["layers"] is None
    assert DownloadInfo.from_json(body).state is DownloadState.CANCELLED
