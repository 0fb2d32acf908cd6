"""The node's JSON shapes as records: what the node writes, engine.client reads back as the
same values, with states the GUI can match on; on the wire the states stay plain strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.records import (
    ClusterInfo,
    DownloadInfo,
    DownloadState,
    FollowerInfo,
    InstanceInfo,
    InstanceState,
    LoadReport,
    RankInfo,
)


def wire(record):
    return json.loads(json.dumps(record.to_json()))


def test_an_instance_goes_over_the_wire_and_back():
    inst = InstanceInfo("a1", "tiny", "pipeline", InstanceState.READY, None,
                        [RankInfo(0, "n0", [0, 2], [2, 2], LoadReport(["m.safetensors"], 9, 99)),
                         RankInfo(1, "n1", [2, 4])])
    body = wire(inst)
    assert body["state"] == "ready" and body["reason"] is None and "warning" not in body
    assert body["ranks"][1] == {"rank": 1, "node": "n1", "layers": [2, 4], "progress": None,
                                "loaded": None}
    back = InstanceInfo.from_json(body)
    assert back == inst and back.state is InstanceState.READY
    # records are read by attribute only (dict-style access is gone)
    assert back.ranks[0].loaded.files == ["m.safetensors"] and back.warning is None
    assert body["ranks"][0]["loaded"] == {"files": ["m.safetensors"], "bytes_read": 9,
                                          "peak_rss": 99}
    with pytest.raises(TypeError):
        back["ranks"]  # noqa: B018


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


def test_a_failed_download_keeps_its_progress_and_error_as_records():
    from engine.errors import ModelNotFound
    from engine.hub.hfcache import RemoteFile
    from engine.hub.progress import Tracker
    from engine.node.hub_routes import Download

    tracker = Tracker("o/m", "main", None)
    tracker.add_files([RemoteFile("a.safetensors", 10, "e")])
    tracker.start("a.safetensors", 4, "hub")
    d = Download("d2", "o/m", "main", None, DownloadState.FAILED, tracker.snapshot(),
                 ModelNotFound("No model o/m", param="repo"), started=2.0)
    body = d.info().to_json()
    assert body["progress"]["files"][0] == {"path": "a.safetensors", "done": 4, "total": 10,
                                            "state": "downloading", "source": "hub",
                                            "speed_Bps": 0.0, "eta_s": None}
    assert body["error"] == ModelNotFound("No model o/m", param="repo").to_openai()["error"]
    back = DownloadInfo.from_json(json.loads(json.dumps(body)))
    assert back.progress.done == 4 and back.progress.files[0].source == "hub"
    assert back.error.code == ModelNotFound.code and back.error.param == "repo"
    assert wire(back) == json.loads(json.dumps(body))


def test_a_status_snapshot_and_its_streams():
    from engine.records import NodeState, RunnerReady, StatusInfo, StreamsInfo

    wire = {"state": "generating", "model": "m", "error": None,
            "runner": {"type": "Ready", "model": "m", "context_length": 8192, "pid": 7,
                       "generating": True}, "version": "0.1.0", "worker_pid": 7,
            "models_dir": "/x", "default_model": "m",
            "streams": {"in_flight": 2, "waiting": 1, "max": 8}}
    st = StatusInfo.from_json(wire)
    assert st.state is NodeState.GENERATING and st.state == "generating"
    assert st.runner == RunnerReady("m", 8192, 7, generating=True)
    assert st.streams == StreamsInfo(2, 1, 8) and st.streams.in_flight == 2
    assert st.cluster is None and st.to_json() == wire  # no cluster: left out
    with_cluster = {**wire, "cluster": {"id": "n1", "name": "a", "instances": [],
                                        "followers": [], "url": "http://a"}}
    st = StatusInfo.from_json(with_cluster)
    assert st.cluster.id == "n1" and st.cluster.url == "http://a"
    assert st.to_json() == with_cluster


def test_each_runner_state_is_its_own_type_with_the_json_it_had():
    from engine.node.state import status_record
    from engine.records import (
        RunnerFailed,
        RunnerIdle,
        RunnerLoading,
        RunnerPreparing,
        RunnerState,
    )

    bodies = [{"type": "Idle", "unloaded": None, "idle_s": 0.0},
              {"type": "Preparing", "model": "m", "step": "importing", "done": 0, "total": 0},
              {"type": "Loading", "model": "m", "layers_done": 3, "layers_total": 8},
              {"type": "Failed", "model": None, "reason": "no such model"}]
    states = [RunnerIdle(), RunnerPreparing("m", "importing"), RunnerLoading("m", 3, 8),
              RunnerFailed(None, "no such model")]
    for body, state in zip(bodies, states):
        assert wire(state) == body and RunnerState.from_json(body) == state
        assert status_record(state, "0.1.0").to_json()["runner"] == body
    assert status_record(states[3], "0.1.0").error == "no such model"
    with pytest.raises(ValueError, match="Sleeping"):
        RunnerState.from_json({"type": "Sleeping"})


def test_a_plan_goes_over_the_wire_and_back_with_the_planners_keys():
    """A real plan (two simulated Studios) as POST /shoal/plan writes it: each placement,
    its ranks, their memory and the times to first token are records with the keys the
    planner's dicts had, in their order, and the client writes back the same bytes."""
    from engine import placement_profiles
    from engine.cluster_records import PlanInfo, RejectedInfo, TopologyInfo
    from engine.node.planning import make_report, plan_info
    from engine.placement.profiles import parse_simulation

    sim = parse_simulation(
        {"nodes": [{"name": "studio-1", "profile": "mac-studio-m3-ultra", "memory_gb": 512},
                   {"name": "studio-2", "profile": "mac-studio-m3-ultra", "memory_gb": 512}],
         "links": [{"mesh": "thunderbolt5-rdma"}],
         "models": [{"name": "tiny", "layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000,
                     "total_params": 1e9, "active_params": 1e9, "quant": "4bit"}]},
        placement_profiles.machines(), placement_profiles.models())
    report = make_report(sim.models["tiny"], sim.nodes, sim.links, 8192, False, None, ["n"])
    body = wire(plan_info(report, 0))
    first = body["placements"][0]
    assert list(first) == ["model", "strategy", "backend", "context", "decode_tps",
                           "decode_tps_full_context", "prefill_tps", "decode_tps_streams",
                           "streams", "lanes", "decode_tps_drafted", "draft_tokens", "ttft",
                           "watts", "decode_j_per_token", "warnings", "ranks", "prefill",
                           "prefill_min", "split_prefill"]
    assert list(first["ranks"][0]) == ["node", "name", "layers", "memory"]
    assert list(first["ranks"][0]["memory"]) == ["weights", "kv_cache", "prefix_cache",
                                                 "activations", "draft", "overhead", "total",
                                                 "usable"]
    assert first["ttft"] and list(first["ttft"][0]) == ["prompt_tokens", "cached_tokens",
                                                        "seconds", "seconds_busy", "joules"]
    best, rank = report.placements[0], report.placements[0].ranks[0]
    assert first["decode_tps"] == best.decode_tps and first["ranks"][0]["layers"] == [0, 4]
    assert first["ranks"][0]["memory"]["total"] == rank.memory.total

    p = PlanInfo.from_json(body)
    assert p.placements[p.best].ranks[0].memory.usable == rank.memory.usable
    assert p.placements[0].ttft[0].prompt_tokens == best.prediction.ttft[0][0]
    assert json.dumps(p.to_json()) == json.dumps(body)
    refused = {**body, "strategies": {"pipeline": None, "tensor": "mlx-lm has no shard()"},
               "rejected": [{"strategy": "tensor", "backend": "ring", "nodes": ["a", "b"],
                             "reason": "no"}], "kv_bits": 8}
    p = PlanInfo.from_json(refused)
    assert p.rejected == [RejectedInfo("tensor", "ring", ["a", "b"], "no")]
    assert p.to_json() == refused
    # the topology's nodes, links and cables: tests/engine/node/test_topology.py
    assert TopologyInfo.from_json({"nodes": []}).thunderbolt == []  # an older node


def test_a_node_describes_its_machine_speed_links_power_and_draft_as_records():
    """GET /shoal/node as a peer reads it: the planner reads attributes, not dict keys, and
    what goes back on the wire is what came (unmeasured speed and power stay absent)."""
    from engine.platform.probes import probe_platform
    from engine.records import MachineInfo, MemoryInfo, NodeInfo, SpeedInfo

    linux = json.loads(json.dumps(probe_platform(system="linux", net_root=Path("/none"))
                                  .to_json()))

    node = {"id": "a", "name": "studio", "instances": [], "followers": [],
            "version": "1.0", "mlx_version": "0.30", "state": "idle", "models": ["m"],
            "links": [{"to": "b", "url": "http://10.0.0.2:8422", "type": "thunderbolt",
                       "rtt_ms": 0.2, "bandwidth_MBps": 4000.0}],
            "machine": {"chip": "Apple M3 Ultra", "os_name": "macOS", "os_version": "26.2",
                        "gpu": "Apple M3 Ultra (80-core GPU)", "mlx_version": "0.30",
                        "mlx_backend": "metal",
                        "memory": {"total_bytes": 512 * 2**30, "available_bytes": 464 * 2**30,
                                   "rule": "Metal's recommended working set",
                                   "free_percent": 80, "unavailable": None}},
            "speed": {"memory_bandwidth_Bps": 7e11, "compute_flops": 2.5e13,
                      "attention_flops": 1e13, "prefill_flops": {"512": 1e13}},
            "platform": {**linux, "interfaces": {"eth0": "ethernet"}},
            "power": {"watts": 12.5, "cpu_watts": 2.0, "gpu_watts": 10.0, "ane_watts": 0.0,
                      "dram_watts": 0.5, "gpu_sram_watts": None, "source": "ioreport",
                      "unavailable": None, "at": 1.0, "serving_watts": 140.0},
            "draft": {"model": "small", "bytes": 1000, "kv_per_token": 8.0}}
    info = NodeInfo.from_json(wire(NodeInfo.from_json(node)))
    assert info.machine.memory.available_bytes == 464 * 2**30
    assert info.links[0].bandwidth_MBps == 4000.0 and info.draft.bytes == 1000
    assert info.power.serving_watts == 140.0 and info.speed.prefill_flops == {"512": 1e13}
    assert info.platform.system == "linux" and info.platform.rdma.enabled is None
    assert info.platform.interfaces == {"eth0": "ethernet"} and wire(info) == node
    fresh = NodeInfo.from_json({"id": "b", "machine": {"memory": {}}})  # just started
    assert fresh.speed == SpeedInfo() and fresh.to_json()["speed"] == {}
    assert fresh.machine == MachineInfo(memory=MemoryInfo()) and fresh.platform is None
    # a peer's part that isn't an object is left out, not kept to fail its readers later
    odd = NodeInfo.from_json({"id": "c", "platform": "macos", "machine": 3, "speed": []})
    assert odd.platform is None and odd.machine is None and odd.speed == SpeedInfo()
    assert NodeInfo.from_json({"id": "d", "platform": {"rdma": 1}}).platform.rdma.enabled \
        is None  # the report reads its own parts as leniently


def test_the_plain_answers_are_records_made_from_the_routes_own_shapes():
    """Each body built by the code that answers the route (or, for /health, as it writes
    it), read back by attribute and written out again unchanged."""
    from pathlib import Path

    from engine.api.openai_chat import _model_card
    from engine.hub.local import LocalModel
    from engine.node.peers import Peer
    from engine.node.request_log import RequestLog
    from engine.records import (
        CatalogInfo,
        CatalogModel,
        FilesAt,
        HealthInfo,
        ModelCard,
        PeerInfo,
        PeerLink,
        RemovedInfo,
        RequestInfo,
    )

    health = HealthInfo.from_json({"ok": True, "version": "0.1.0"})
    assert health.ok and health.version == "0.1.0"

    card = _model_card(LocalModel("tiny", Path("/m/tiny"), "shoal", 1234, 4, "bf16",
                                  "llama", 2048))
    got = ModelCard.from_json(card)
    assert got.id == "tiny" and got.object == "model" and got.owned_by == "shoal"
    assert got.shoal.layers == 4 and got.shoal.context_length == 2048
    assert wire(got) == card
    with pytest.raises(TypeError):
        got["id"]  # noqa: B018
    # a model an instance on another node serves: its card carries that instance
    inst = InstanceInfo("a1", "big", "pipeline", InstanceState.READY)
    remote = {"id": "big", "object": "model", "created": 0, "owned_by": "shoal",
              "shoal": {"instance": inst.to_json()}}
    got = ModelCard.from_json(remote)
    assert got.shoal.instance == inst and got.shoal.layers is None and wire(got) == remote

    import time

    from aiohttp.test_utils import make_mocked_request
    log = RequestLog()
    log.add(make_mocked_request("POST", "/v1/chat/completions", headers={"User-Agent": "curl/8"}),
            429, time.monotonic(), "Busy: try again")
    req = log.recent()[0]
    entry = req.to_json()
    assert req.status == 429 and req.reason == "Busy: try again"
    assert RequestInfo.from_json(entry) == req and wire(req) == entry

    peer = Peer("http://10.0.0.2:8422", id="n2", name="b", reachable=True, trusted=True,
                last_seen=1.0, link=PeerLink("ethernet", 0.4, at=5.0)).public().to_json()
    got = PeerInfo.from_json(peer)
    assert got.trusted and got.name == "b" and got.link.type == "ethernet"
    assert got.link.measured and wire(got) == peer
    unmeasured = Peer("http://10.0.0.3:8422").public().to_json()
    assert unmeasured["link"] == {}  # as before the link was a record
    assert not PeerInfo.from_json(unmeasured).link.measured

    here = CatalogModel("o/m-4bit", "M 4bit", 4e9, "4bit", 2 * 10**9, 28, 32768,
                        "apache-2.0", ["size_bytes"], "catalog",
                        [FilesAt("hf-cache", path="/hf/o--m"),
                         FilesAt("peer", node="b", files=3)],
                        fits=False, fit_basis="planner", fit_reason="needs 9 GB")
    found = CatalogInfo([here], "offline").to_json()
    body = found["models"][0]
    assert list(body) == ["id", "name", "parameters", "quantization", "size_bytes", "layers",
                          "context_length", "licence", "approximate", "source", "local",
                          "downloads", "likes", "fits", "fit_basis", "fit_reason"]
    assert body["local"] == [{"source": "hf-cache", "path": "/hf/o--m"},
                             {"source": "peer", "node": "b", "files": 3}]
    got = CatalogInfo.from_json(found)
    m = got.models[0]
    assert m.fits is False and m.fit_reason == "needs 9 GB" and m.approximate == ["size_bytes"]
    assert got == CatalogInfo([here], "offline") and wire(got) == found
    assert "fit_reason" not in CatalogModel("o/m").to_json()  # only when the planner says no

    gone = RemovedInfo.from_json({"deleted": "o/m", "freed_bytes": 99})
    assert gone.deleted == "o/m" and gone.freed_bytes == 99


def test_the_peer_routes_bodies_are_records_with_the_same_json():
    """What an instance's owner and its ranks' nodes tell each other (/shoal/peer/...)."""
    from engine.cluster_records import FollowerState, RankPorts
    from engine.protocol import RankReady
    from engine.records import InstanceState, RankInfo

    report = RankReady(1, 2, "pipeline", [2, 4], ["model.safetensors"], 1000, 5000).report()
    assert report.to_json() == {"files": ["model.safetensors"], "bytes_read": 1000,
                                "peak_rss": 5000}
    ready = FollowerState(InstanceState.READY, None, 1, [2, 2], report)
    body = ready.to_json()
    assert body == {"state": "ready", "reason": None, "rank": 1, "progress": [2, 2],
                    "loaded": report.to_json()}
    assert FollowerState.from_json(body) == ready
    gone = FollowerState(InstanceState.STOPPED, "this node runs no such instance")
    assert gone.to_json() == {"state": "stopped", "reason": "this node runs no such instance"}
    assert FollowerState.from_json(gone.to_json()).state is InstanceState.STOPPED
    rank = RankInfo(1, "n2", [2, 4], None, report)
    assert RankInfo.from_json(rank.to_json()).loaded.bytes_read == 1000
    ports = RankPorts("10.0.0.2", [5001, 5002])
    assert (ports.ring, ports.bell) == ("10.0.0.2:5001", "10.0.0.2:5002")
    assert ports.to_json() == {"host": "10.0.0.2", "ports": [5001, 5002]}
