"""The note that a model spread over machines on a shared network sends its working data
unencrypted: which placements need it, rule by rule (no Qt), then what a user sees in the
placement view as the placement and the links change, and that the note fits a laptop's
window in light and dark. The node is a stand-in that answers /shoal/plan with a split
over the nodes asked for."""

import pytest
from PySide6.QtCore import QPoint, QRect, Qt

from app.link_privacy import EDGE_HINT, NOTE, detail, is_private, shared_links
from app.snapshots import LinkEdge
from engine.cluster_records import PlanInfo, TopologyInfo
from engine.errors import BadRequest, InsufficientMemory
from engine.records import ModelCard, ModelFacts

pytestmark = pytest.mark.app_errors("Can't reach the node")  # the window's own node

GB = 10**9
MODEL = "Qwen3-32B-4bit"
NAMES = {"a": "studio", "b": "mini", "c": "laptop"}


def edge(a, b, kind):
    return LinkEdge(a, b, kind, 0.4, 110.0)


# --- which placements need the note --------------------------------------------------------
def test_one_machine_needs_no_note():
    assert shared_links(["a"], [edge("a", "b", "ethernet")]) == []
    assert shared_links([], []) == []


def test_two_ranks_on_one_node_are_one_machine():
    assert shared_links(["a", "a"], []) == []


def test_a_loopback_link_needs_no_note():
    """Two nodes on one machine (a test cluster, or two Shoal homes on one Mac)."""
    assert shared_links(["a", "b"], [edge("a", "b", "loopback")]) == []


@pytest.mark.parametrize("kind", ["thunderbolt-rdma", "thunderbolt-ip", "thunderbolt"])
def test_a_thunderbolt_cable_needs_no_note(kind):
    assert shared_links(["a", "b"], [edge("a", "b", kind)]) == []


@pytest.mark.parametrize("kind", ["ethernet", "wifi", "wi-fi", "network", "", "infiniband"])
def test_a_shared_or_unknown_link_needs_the_note(kind):
    assert shared_links(["a", "b"], [edge("b", "a", kind)]) == [("a", "b", kind)]


def test_a_pair_with_no_measured_link_needs_the_note():
    """Until a link is measured nothing says it is a cable: MLX would use the network."""
    assert shared_links(["a", "b"], []) == [("a", "b", None)]


def test_only_the_shared_pairs_are_named_in_rank_order():
    edges = [edge("a", "b", "thunderbolt-rdma"), edge("b", "c", "thunderbolt-ip"),
             edge("c", "a", "wifi")]
    assert shared_links(["a", "b", "c"], edges) == [("a", "c", "wifi")]
    assert shared_links(["c", "b", "a"], edges) == [("c", "a", "wifi")]
    assert shared_links(["a", "b"], edges) == []  # the Wi-Fi pair isn't in this one


def test_every_pair_counts_not_only_neighbours():
    edges = [edge("a", "b", "thunderbolt-rdma"), edge("b", "c", "thunderbolt-rdma")]
    assert shared_links(["a", "b", "c"], edges) == [("a", "c", None)]


@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring"])
def test_rdma_backends_need_no_note(backend):
    """jaccl runs only over Thunderbolt cables with RDMA, whatever else links the pair."""
    assert shared_links(["a", "b"], [edge("a", "b", "ethernet")], backend) == []
    assert shared_links(["a", "b"], [edge("a", "b", "ethernet")], "ring") != []


def test_the_detail_names_the_machines_the_links_and_mlx():
    text = detail([("a", "b", "ethernet"), ("a", "c", "wifi"), ("b", "c", "network"),
                   ("a", "d", None)], lambda n: NAMES.get(n, n))
    assert text.startswith("studio and mini are linked over Ethernet, studio and laptop "
                           "over Wi-Fi, mini and laptop over a network, studio and d over "
                           "a network (not measured yet). MLX")
    assert "no encryption" in text


def test_the_note_speaks_plainly():
    for word in ("rank", "ring", "MLX", "tensor", "activation"):
        assert word not in NOTE
    assert "unencrypted" in NOTE and "Thunderbolt cable" in NOTE
    assert is_private("loopback") and not is_private("wifi") and not is_private(None)


# --- what a user sees -------------------------------------------------------------------------
def node(nid, me=False):
    return {"id": nid, "name": NAMES[nid], "self": me, "reachable": True, "trusted": True,
            "state": "idle",
            "machine": {"memory": {"total_bytes": 64 * GB, "available_bytes": 40 * GB}}}


def cable(a, b, rdma):
    return {"a": a, "b": b, "a_port": 1, "b_port": 1, "a_interface": "en2",
            "b_interface": "en2", "speed": "80 Gb/s", "via": None,
            "type": "thunderbolt-rdma" if rdma else "thunderbolt-ip", "rdma": rdma,
            "why": None if rdma else "RDMA is disabled"}


def topology(ids, links=(), cables=()):
    """A /shoal/topology answer: `ids` (the first is this node), links as (a, b, type)."""
    return TopologyInfo.from_json({
        "nodes": [node(n, me=i == 0) for i, n in enumerate(ids)],
        "links": [{"from": a, "to": b, "type": kind, "rtt_ms": 0.4, "bandwidth_MBps": 110.0}
                  for a, b, kind in links],
        "thunderbolt": [cable(a, b, rdma) for a, b, rdma in cables]}).to_json()


class Planner:
    """plan() as the node answers it: the model's 64 layers split over the nodes asked for
    (its best: every machine, the model needs them all), or `refuse`'s error."""

    base_url = "http://127.0.0.1:9"  # never polled here: the tests hand snapshots in

    def replicas(self):
        """GET /shoal/replicas: no model runs as copies here."""
        from engine.records import ReplicasInfo
        return ReplicasInfo()

    def __init__(self, state=None):
        self.state, self.refuse = state, None

    def plan(self, model, context=None, strategy=None, nodes=None, backend=None, kv_bits=None,
             rank=None):
        if self.refuse is not None:
            raise self.refuse
        ids = [n["node"] for n in nodes] if nodes else [
            n["id"] for n in self.state.topology["nodes"]]
        ranks = [{"node": nid, "name": NAMES[nid],
                  "layers": [i * 64 // len(ids), (i + 1) * 64 // len(ids)],
                  "memory": {"weights": 9 * GB, "kv_cache": GB, "total": 11 * GB,
                             "usable": 48 * GB}} for i, nid in enumerate(ids)]
        return PlanInfo.from_json({"model": model, "context": 8192, "best": 0, "placements": [{
            "model": model, "strategy": "pipeline", "backend": backend or "ring",
            "context": 8192, "ranks": ranks, "decode_tps": 14.9, "decode_tps_full_context": 12.1,
            "prefill_tps": 310.0,
            "ttft": [{"prompt_tokens": 1000, "seconds": 3.2, "cached_tokens": 0,
                      "seconds_busy": 3.2}]}],
            "notes": ["mini: no figures for chip Apple M4 Pro"]})


def check(view, node_id, on):
    for i in range(view.node_list.count()):
        item = view.node_list.item(i)
        if item.data(Qt.ItemDataRole.UserRole) == node_id:
            item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)


def ranks_of(view):
    return [r["node"] for r in (view.prediction or {"ranks": []})["ranks"]]


@pytest.fixture
def planner():
    return Planner()  # the placement and topology views over it: tests/app/conftest.py


def test_the_note_follows_the_placement_and_the_links(qtbot, views):
    state, place, topo, planner = views
    note, more = place.launch.privacy, place.launch.privacy_detail
    state.set_topology(topology(["a", "b"], [("a", "b", "network")]))
    place.set_models([ModelCard(MODEL, shoal=ModelFacts(layers=64))])
    qtbot.waitUntil(lambda: ranks_of(place) == ["a", "b"] and place.node_list.count() == 2,
                    timeout=5000)
    assert note.isVisible() and note.text() == NOTE
    assert more.isVisible() and more.text().startswith(
        "studio and mini are linked over a network.")

    # This machine alone: nothing crosses a network.
    check(place, "b", False)
    qtbot.waitUntil(lambda: ranks_of(place) == ["a"], timeout=5000)
    assert not note.isVisible() and not more.isVisible()
    check(place, "b", True)
    qtbot.waitUntil(lambda: note.isVisible(), timeout=5000)

    # A Thunderbolt cable joins them: no note, while the placement stays as it was.
    state.set_topology(topology(["a", "b"], [("a", "b", "network")], [("a", "b", False)]))
    qtbot.waitUntil(lambda: not note.isVisible(), timeout=5000)
    assert ranks_of(place) == ["a", "b"] and not more.isVisible()
    state.set_topology(topology(["a", "b"], [("a", "b", "loopback")]))  # one machine
    qtbot.waitUntil(lambda: "Loopback" in topo.edges[frozenset("ab")].label.text(),
                    timeout=5000)
    assert not note.isVisible()

    # A third machine on Wi-Fi, cabled to neither; the user adds it to the placement: the
    # note names each pair it shares a network with.
    state.set_topology(topology(["a", "b", "c"], [("a", "b", "thunderbolt-rdma"),
                                                  ("a", "c", "wifi"), ("b", "c", "wifi")]))
    qtbot.waitUntil(lambda: place.node_list.count() == 3, timeout=5000)
    assert not note.isVisible()
    check(place, "c", True)
    qtbot.waitUntil(lambda: ranks_of(place) == ["a", "b", "c"], timeout=5000)
    qtbot.waitUntil(lambda: note.isVisible(), timeout=5000)
    assert more.text().startswith("studio and laptop are linked over Wi-Fi, mini and "
                                  "laptop over Wi-Fi. MLX")
    # the topology's Wi-Fi link says so too, the cable doesn't
    qtbot.waitUntil(lambda: len(topo.edges) == 3, timeout=5000)
    assert EDGE_HINT in topo.edges[frozenset("ac")].box.toolTip()
    assert EDGE_HINT not in topo.edges[frozenset("ab")].box.toolTip()

    # Refused for memory, it can still be launched anyway: the note stays.
    planner.refuse = InsufficientMemory("laptop needs 22 GB, has 12 GB")
    place.context_spin.setValue(32768)
    place._context_edited()  # as when the user leaves the field
    qtbot.waitUntil(lambda: place.launch.force_button.isVisible(), timeout=5000)
    assert note.isVisible() and "laptop over Wi-Fi" in more.text()
    # Refused outright: nothing to launch, no note.
    planner.refuse = BadRequest("this model can't be split over 3 nodes")
    place.context_spin.setValue(16384)
    place._context_edited()
    qtbot.waitUntil(lambda: "can't be split" in place.reason_label.text(), timeout=5000)
    assert not note.isVisible() and not more.isVisible()



@pytest.fixture
def shoal(qtbot, home, port):
    """The app's window with its views built, the placement asking the stand-in planner
    (nothing answers on `port`)."""
    from app.main import ShoalApp
    app = ShoalApp(home, port, tray_available=False)
    qtbot.addWidget(app.window)
    app._build_views()
    app._started()
    app.placement.client = Planner(app.state)
    app.window.show()
    yield app
    app.appearance.set_mode("light")  # the next test starts as the default does
    app.shutdown()


def shown_whole(label, window):
    """The label's whole text is on screen: tall enough for its wrapped lines, not covered
    or cut by its parents, inside the window."""
    rect = QRect(label.mapTo(window, QPoint(0, 0)), label.size())
    return (label.isVisible() and label.height() >= label.heightForWidth(label.width())
            and label.visibleRegion().boundingRect() == label.rect()
            and window.rect().contains(rect))


def ink(label):
    """How far the label's text stands out from its background (0-255 of lightness)."""
    image = label.grab().toImage()
    back = image.pixelColor(0, 0).lightness()
    return max(abs(image.pixelColor(x, y).lightness() - back)
               for x in range(0, image.width(), 2) for y in range(image.height()))


def test_the_note_fits_a_laptop_window_in_light_and_dark(qtbot, shoal):
    win, place = shoal.window, shoal.placement
    shoal.state.set_topology(topology(["a", "b", "c"], [("a", "b", "ethernet"),
                                                        ("a", "c", "wifi"),
                                                        ("b", "c", "wifi")]))
    place.set_models([ModelCard(MODEL, shoal=ModelFacts(layers=64))])
    qtbot.waitUntil(lambda: ranks_of(place) == ["a", "b", "c"], timeout=5000)
    win.show_view("Placement")
    win.resize(1280, 800)
    qtbot.waitUntil(lambda: win.size().width() == 1280, timeout=3000)
    launch = place.launch
    for mode in ("light", "dark"):
        shoal.window.appearance_actions[mode].trigger()
        qtbot.waitUntil(lambda: shown_whole(launch.privacy, win) and
                        shown_whole(launch.privacy_detail, win), timeout=3000)
        assert shown_whole(launch.launch_button, win)  # the button under it isn't pushed off
        assert ink(launch.privacy) > 80 and ink(launch.privacy_detail) > 60, mode
