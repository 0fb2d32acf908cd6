"""The figures a user trusts: the placement re-plans when a node's speed calibration
finishes or the cluster changes, shows what was measured beside what was predicted, a
running model is in use rather than "planned", and one machine alone gets a card that
says how to add another. The node is a stand-in that answers /shoal/plan as the planner
does (its figures depend on whether the node's speed is known)."""

import pytest

from engine.cluster_records import PlanInfo, TopologyInfo
from engine.records import ModelCard, ModelFacts

GB = 10**9
MODEL = "SmolLM2-135M-Instruct"


def node(nid, name, me=False, speed=None):
    return {"id": nid, "name": name, "self": me, "reachable": True, "trusted": True,
            "state": "idle",
            "machine": {"memory": {"total_bytes": 32 * GB, "available_bytes": 20 * GB}},
            **({"speed": speed} if speed else {})}


class Planner:
    """plan() as the node answers it: 303 tokens/s from the chip table until the node's
    own measurement is in, then 14.9."""

    base_url = "http://127.0.0.1:9"  # never polled here: the tests hand snapshots in

    def replicas(self):
        """GET /shoal/replicas: no model runs as copies here."""
        from engine.records import ReplicasInfo
        return ReplicasInfo()

    def __init__(self):
        self.state, self.asked = None, []

    def plan(self, model, context=None, strategy=None, nodes=None, backend=None, kv_bits=None,
             rank=None):
        self.asked.append((strategy, nodes))
        me = next(n for n in self.state.topology["nodes"] if n.get("self"))
        calibrated = bool(me.get("speed"))
        ids = [n["node"] for n in nodes] if nodes else [me["id"]]
        ranks = [{"node": nid, "name": nid,
                  "layers": [i * 30 // len(ids), (i + 1) * 30 // len(ids)],
                  "memory": {"weights": GB // 4, "kv_cache": GB // 8, "total": GB // 2,
                             "usable": 20 * GB}} for i, nid in enumerate(ids)]
        tps = 14.9 if calibrated else 303.0
        return PlanInfo.from_json({"model": model, "context": 8192, "best": 0, "placements": [{
            "model": model, "strategy": "pipeline", "backend": "ring", "context": 8192,
            "ranks": ranks, "decode_tps": tps, "decode_tps_full_context": tps,
            "prefill_tps": 900.0, "decode_tps_drafted": 31.0 if calibrated else 303.0}]})


@pytest.fixture
def planner():
    return Planner()  # the placement and topology views over it: tests/app/conftest.py


def ready(state, model=MODEL):
    state.set_status({"state": "idle", "model": model, "cluster": {"id": "a"},
                      "runner": {"type": "Ready", "model": model, "context_length": 8192}})


def test_the_plan_follows_calibration_and_shows_what_was_measured(qtbot, views):
    state, place, topo, client = views
    state.set_topology(TopologyInfo.from_json({"nodes": [node("a", "studio", me=True)]}).to_json())
    ready(state)
    place.set_models([ModelCard(MODEL, shoal=ModelFacts(layers=30))])
    qtbot.waitUntil(lambda: place.prediction is not None, timeout=5000)
    assert place.prediction["decode_tps"] == 303.0
    assert place.headline.text().startswith("Predicted: 303 tokens/s")
    assert "drafts" not in place.headline.text()  # no faster with them: not shown

    # The node finishes measuring its speed: the plan made before it is asked again.
    speed = {"memory_bandwidth_Bps": 9e9, "compute_flops": 2e11}
    state.set_topology(
        TopologyInfo.from_json({"nodes": [node("a", "studio", me=True, speed=speed)]}).to_json())
    qtbot.waitUntil(lambda: place.prediction["decode_tps"] == 14.9, timeout=5000)
    assert place.headline.text().startswith("Predicted: 14.9 tokens/s")
    # speculative decoding's prediction shows beside, where it beats plain decode
    assert "31.0 tokens/s with drafts" in place.headline.text()

    # The model runs here: in use, not planned; a reply's measured speed shows beside.
    assert place.running and state.planned == {}
    assert "send a message" in place.measured_label.text()
    place.set_measured({"model": MODEL, "generation_tps": 8.5})
    assert place.measured_label.text() == ("Running now · measured 8.5 tokens/s decode on "
                                           "the last reply (predicted 14.9)")
    place.set_measured({"model": "another", "generation_tps": 99.0})
    assert "8.5" in place.measured_label.text()

    # Unloaded: what the plan needs is planned again, and nothing claims to run.
    state.set_status({"state": "idle", "cluster": {"id": "a"}, "runner": {"type": "Idle"}})
    qtbot.waitUntil(lambda: not place.running, timeout=5000)
    assert state.planned == {"a": GB // 2} and not place.measured_label.isVisible()


def test_a_new_machine_is_planned_for_and_one_alone_is_told_how_to_add_one(qtbot, views):
    state, place, topo, client = views
    state.set_topology(TopologyInfo.from_json({"nodes": [node("a", "studio", me=True)]}).to_json())
    qtbot.waitUntil(lambda: len(topo.cards) == 1, timeout=5000)
    assert topo.add_card.isVisible() and topo.add_button.isVisible()
    with qtbot.waitSignal(topo.add_machine_requested):
        topo.add_button.click()
    place.set_models([ModelCard(MODEL, shoal=ModelFacts(layers=30))])
    qtbot.waitUntil(lambda: place.prediction is not None, timeout=5000)
    asked = len(client.asked)

    state.set_topology(TopologyInfo.from_json({"nodes": [node("a", "studio", me=True),
                                                          node("b", "mini")]}).to_json())
    qtbot.waitUntil(lambda: len(client.asked) > asked, timeout=5000)  # re-planned
    qtbot.waitUntil(lambda: len(topo.cards) == 2, timeout=5000)
    assert not topo.add_card.isVisible()  # two machines: the button is enough
