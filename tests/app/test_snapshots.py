"""What the topology view draws from a node's snapshot: machines that are unpaired, offline
or on another version look different, memory bars add up, links are labelled, and the
platform's fixes are shown (the snapshot is shaped like a real /shoal/topology answer)."""

import pytest
from PySide6.QtWidgets import QWidget

from app.cluster_state import ClusterState
from app.snapshots import fit_label, link_edges, memory_bar, node_cards, running_instances
from app.tasks import Tasks
from app.topology import TopologyView
from engine.client import NodeClient

GB = 10**9
BRIDGE = ("The Thunderbolt Bridge (bridge0) includes en2, which is cabled to other Macs: "
          "bridged Thunderbolt ports loop traffic between Macs and keep RDMA (jaccl) from "
          "using them. To fix it, disable the Thunderbolt Bridge service in System Settings "
          "› Network")
RDMA_OFF = "RDMA is disabled: run `rdma_ctl enable` in Recovery, then restart."


def machine(total, available, chip="Apple M3 Ultra"):
    return {"chip": chip, "os_name": "macOS", "os_version": "15.5",
            "memory": {"total_bytes": total, "available_bytes": available,
                       "rule": "GPU working set"}}


def platform(warnings=(), rdma_enabled=None, explanation=None):
    return {"warnings": list(warnings),
            "rdma": {"enabled": rdma_enabled, "explanation": explanation}}


TOPOLOGY = {
    "nodes": [
        {"id": "aaaa1111", "name": "studio", "self": True, "reachable": True, "trusted": True,
         "version": "0.1.0", "state": "idle", "machine": machine(192 * GB, 150 * GB),
         "platform": platform([BRIDGE], False, RDMA_OFF),
         "power": {"watts": 41.5, "unavailable": None}, "models": ["m"],
         "links": [{"to": "bbbb2222", "type": "thunderbolt-ip", "rtt_ms": 0.21,
                    "bandwidth_MBps": 4200.0}]},
        {"id": "bbbb2222", "name": "mini", "url": "http://10.0.0.2:8422", "self": False,
         "reachable": True, "trusted": True, "version": "0.1.0", "warning": None,
         "machine": machine(64 * GB, 40 * GB, "Apple M4 Pro"),
         "platform": platform(rdma_enabled=None,
                              explanation="unavailable: read on macOS only"),
         "power": {"watts": None, "unavailable": "unavailable: no IOReport"},
         "links": [{"to": "aaaa1111", "type": "thunderbolt-ip", "rtt_ms": 0.25,
                    "bandwidth_MBps": 4100.0}]},
        {"id": "cccc3333", "name": "laptop", "url": "http://10.0.0.3:8422", "self": False,
         "reachable": True, "trusted": True, "version": "0.2.0",
         "warning": "runs Shoal 0.2.0, this node runs 0.1.0: update both",
         "machine": machine(32 * GB, 20 * GB)},
        {"url": "http://10.0.0.4:8422", "self": False, "reachable": True, "trusted": False,
         "error": "not in this cluster: the signature doesn't match"},
        {"id": "eeee5555", "name": "old", "url": "http://10.0.0.5:8422", "self": False,
         "reachable": False, "trusted": False, "error": "Can't reach 10.0.0.5"},
    ],
    "links": [{"from": "aaaa1111", "to": "bbbb2222", "type": "thunderbolt-ip",
               "rtt_ms": 0.21, "bandwidth_MBps": 4200.0},
              {"from": "bbbb2222", "to": "aaaa1111", "type": "thunderbolt-ip",
               "rtt_ms": 0.25, "bandwidth_MBps": 4100.0}],
}


def test_each_kind_of_machine_is_told_apart():
    cards = {c.name: c for c in node_cards(TOPOLOGY)}
    assert cards["studio"].is_self and cards["studio"].kind == "ok"
    assert cards["mini"].kind == "ok" and cards["mini"].usable
    assert cards["laptop"].kind == "mismatch" and "0.2.0" in cards["laptop"].detail
    unpaired = cards["http://10.0.0.4:8422"]
    assert unpaired.kind == "unpaired" and "not in this cluster" in unpaired.detail
    assert cards["old"].kind == "offline" and not cards["old"].usable
    # The bridge loop and RDMA fixes come from the platform report; Linux's "unavailable"
    # notes are not problems.
    assert cards["studio"].warnings == (BRIDGE, f"RDMA: {RDMA_OFF}")
    assert cards["mini"].warnings == ()
    assert cards["mini"].power_unavailable == "unavailable: no IOReport"


def test_memory_bar_parts_add_up():
    node = TOPOLOGY["nodes"][0]
    bar = memory_bar(node, shoal=30 * GB, planned=100 * GB)
    assert (bar.others, bar.shoal, bar.planned, bar.free) == (12 * GB, 30 * GB, 100 * GB,
                                                              50 * GB)
    assert bar.others + bar.shoal + bar.planned + bar.free == bar.total
    too_big = memory_bar(node, planned=200 * GB)
    assert too_big.planned == 150 * GB and too_big.overflow == 50 * GB and too_big.free == 0


def test_links_are_one_edge_per_pair_with_a_label():
    (edge,) = link_edges(TOPOLOGY)
    assert edge.label == "Thunderbolt IP · 0.2 ms · 4.2 GB/s"


def test_a_thunderbolt_cable_types_the_edge_with_per_link_rdma():
    # "thunderbolt" as /shoal/topology gives it (engine.node.topology.cluster_cables).
    cable = {"a": "aaaa1111", "b": "bbbb2222", "speed": "80 Gb/s", "via": None}
    no_rdma = "mini sees no RDMA service from studio on this cable"
    topo = {**TOPOLOGY, "thunderbolt": [{**cable, "rdma": False, "why": no_rdma}]}
    (edge,) = link_edges(topo)
    assert edge.label == "Thunderbolt IP · 0.2 ms · 4.2 GB/s" and edge.extra == (no_rdma,)
    topo["thunderbolt"].append({**cable, "rdma": True, "why": None})
    (edge,) = link_edges(topo)
    assert edge.label == "Thunderbolt RDMA · 0.2 ms · 4.2 GB/s" and edge.extra == ()
    # A cable between nodes that measured no link yet still shows.
    unmeasured = {**TOPOLOGY, "links": [], "thunderbolt": [{**cable, "rdma": True}]}
    assert [e.label for e in link_edges(unmeasured)] == ["Thunderbolt RDMA"]


def test_a_thunderbolt_4_mac_with_rdma_enabled_is_not_offered_for_jaccl():
    tb4 = ("This Mac's Thunderbolt ports are Thunderbolt 4 (up to 40 Gb/s), which has no "
           "RDMA: ibv_devices lists no devices on this hardware")
    node = {**TOPOLOGY["nodes"][1], "platform": platform(rdma_enabled=True, explanation=tb4)}
    (card,) = node_cards({"nodes": [node]})
    assert card.rdma is False and card.warnings == (f"RDMA: {tb4}",)
    ready = {**node, "platform": platform(rdma_enabled=True)}
    assert node_cards({"nodes": [ready]})[0].rdma is True


def test_a_node_that_left_keeps_nothing_it_last_said():
    # The node's peer list keeps what a peer last said of itself; none of it is true now.
    gone = {**TOPOLOGY["nodes"][1], "reachable": False, "error": "not answering",
            "state": "generating", "power": {"watts": 30.0},
            "instances": [{"id": "i1", "state": "ready", "model": "m"}]}
    topo = {**TOPOLOGY, "nodes": [TOPOLOGY["nodes"][0], gone]}
    (_, card) = node_cards(topo, shoal_use={"bbbb2222": 9 * GB},
                           planned={"bbbb2222": 5 * GB})
    assert card.kind == "offline" and card.name == "mini" and card.chip == "Apple M4 Pro"
    assert (card.memory, card.state, card.watts, card.models) == (None, None, None, ())
    assert link_edges(topo) == [] and running_instances(topo) == []


def test_fit_label():
    cards = node_cards(TOPOLOGY)
    assert fit_label(10 * GB, cards) == "fits one node"
    assert fit_label(170 * GB, cards) == "fits the cluster"
    assert fit_label(500 * GB, cards) == "too big"


@pytest.fixture
def state(qapp):
    tasks = Tasks()
    client = NodeClient("http://127.0.0.1:9")  # never asked: the snapshot is set by hand
    yield ClusterState(tasks, client)
    client.close()


def test_topology_view_draws_the_snapshot(qtbot, state):
    view = TopologyView(state)
    qtbot.addWidget(view)
    view.resize(1000, 700)
    view.show()
    state.set_topology(TOPOLOGY)
    qtbot.waitUntil(lambda: len(view.cards) == 5)
    lines = {nid: item.lines() for nid, item in view.cards.items()}
    assert lines["aaaa1111"][0] == "studio  (this machine)"
    assert "Version mismatch: runs Shoal 0.2.0" in lines["cccc3333"][1]
    assert lines["http://10.0.0.4:8422"][1].startswith("Not in this cluster")
    assert lines["eeee5555"][1].startswith("Offline")
    assert view.cards["eeee5555"].opacity() < 1
    studio = "\n".join(lines["aaaa1111"])
    assert "42.0 GB of 192.0 GB used" in studio and "42 W" in studio
    assert "⚠ 2 to fix" in studio
    assert [e.label.text() for e in view.edges.values()] == [
        "Thunderbolt IP · 0.2 ms · 4.2 GB/s"]
    assert view.problems.isVisible()
    assert f"studio: {BRIDGE}" in view.problems.text() and "rdma_ctl enable" in \
        view.problems.text()

    # A machine that leaves the snapshot leaves the view, with its link.
    state.set_topology({"nodes": TOPOLOGY["nodes"][:1], "links": []})
    qtbot.waitUntil(lambda: list(view.cards) == ["aaaa1111"])
    assert view.edges == {}


def test_planned_shows_only_for_the_plan_the_user_has_seen(qtbot, state):
    view = TopologyView(state)
    qtbot.addWidget(view)
    view.show()
    placement = QWidget()  # stands in for the Placement tab, not on screen at first
    qtbot.addWidget(placement)
    state.watch_plan_view(placement)
    state.set_topology(TOPOLOGY)
    qtbot.waitUntil(lambda: len(view.cards) == 5)

    def studio():
        return view.cards["aaaa1111"].lines()[-2]

    # The app plans the first model by itself at start-up: nobody looked at that plan.
    with qtbot.waitSignal(state.changed):
        state.set_planned({"aaaa1111": 100 * GB})
    assert studio() == "42.0 GB of 192.0 GB used"
    placement.show()  # the user opens Placement: the plan is on screen
    qtbot.waitUntil(lambda: studio() == "42.0 GB used + 100.0 GB planned of 192.0 GB")
    state.set_planned({})  # launched, or nothing fits: nothing planned
    qtbot.waitUntil(lambda: studio() == "42.0 GB of 192.0 GB used")


def test_card_text_that_does_not_fit_is_in_its_tooltip(qtbot, state):
    long_os = {**machine(64 * GB, 40 * GB), "os_name": "Ubuntu 22.04.4 LTS",
               "os_version": "6.8.0-1015-azure-fde #17~22.04.1-Ubuntu SMP"}
    reason = ("The connection to 10.0.0.5:8422 was refused: Shoal on this machine isn't "
              "running, or a firewall blocks the port")
    nodes = [{**TOPOLOGY["nodes"][0], "machine": long_os}, *TOPOLOGY["nodes"][1:4],
             {**TOPOLOGY["nodes"][4], "error": reason}]
    view = TopologyView(state)
    qtbot.addWidget(view)
    view.resize(1366 - 40, 768 - 140)  # the tab in a laptop's window
    view.show()
    state.set_topology({**TOPOLOGY, "nodes": nodes})
    qtbot.waitUntil(lambda: len(view.cards) == 5)

    def inside(card):  # the whole card within the view, fixes listed below it or not
        return view.view.viewport().rect().contains(
            view.view.mapFromScene(card.sceneBoundingRect()).boundingRect())

    qtbot.waitUntil(lambda: view.problems.isVisible() and all(map(inside,
                                                                   view.cards.values())))
    elided = 0
    for card in view.cards.values():
        for full, drawn in zip(card.lines(), card.drawn_lines(view.scene.font())):
            if drawn != full:
                elided += 1
                assert drawn.endswith("…") and full in card.toolTip()
    assert elided >= 2  # the OS line and the offline reason are too long for a card
    assert view.cards["http://10.0.0.4:8422"].lines()[1] == ("Not in this cluster: the "
                                                             "signature doesn't match")
    assert f"Offline: {reason}" in view.cards["eeee5555"].toolTip()
