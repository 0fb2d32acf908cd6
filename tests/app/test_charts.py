"""The live charts: per-request speed and time to first token from the chat's figures,
memory and watts per node from the topology, joules per token, power "unavailable" with
the reason, and a time axis that follows the clock."""

import pyqtgraph as pg

from app.charts import ChartsView
from app.metrics import Metrics
from app.snapshots import node_cards
from engine.records import StatusInfo

GB = 10**9


def topology(watts_a, watts_b=None, used_a=10 * GB):
    def node(nid, name, watts, used, me=False):
        return {"id": nid, "name": name, "self": me, "reachable": True, "trusted": True,
                "machine": {"memory": {"total_bytes": 64 * GB,
                                       "available_bytes": 64 * GB - used}},
                "power": {"watts": watts,
                          "unavailable": None if watts else "unavailable: no RAPL counters"}}
    return {"nodes": [node("a", "studio", watts_a, used_a, True),
                      node("b", "mini", watts_b, 5 * GB)], "links": []}


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def test_charts_follow_requests_and_nodes(qtbot):
    clock = Clock()
    metrics = Metrics(window_s=120, clock=clock)
    view = ChartsView(metrics)
    qtbot.addWidget(view)
    view.resize(900, 700)
    view.show()

    metrics.add_cards(node_cards(topology(None)))
    metrics.add_request({"generation_tps": 40.0, "ttft_s": 0.2})
    clock.now += 5
    metrics.add_cards(node_cards(topology(30.0, 12.0, used_a=20 * GB)))
    metrics.add_live(tokens=11, seconds=0.5)
    view.tick()
    assert list(view.live_curve.getData()[1]) == [20.0]  # 10 tokens after the first in 0.5 s
    metrics.add_request({"generation_tps": 50.0, "ttft_s": 0.1})
    view.tick()

    assert list(view.tps_curve.getData()[1]) == [40.0, 50.0]
    assert list(view.ttft_curve.getData()[1]) == [0.2, 0.1]
    assert view.live_curve.getData()[1] is None or len(view.live_curve.getData()[1]) == 0
    assert list(view.node_curves[("memory", "studio")].getData()[1]) == [10.0, 20.0]
    assert list(view.node_curves[("watts", "mini")].getData()[1]) == [12.0]
    assert list(view.cluster_curve.getData()[1]) == [42.0]
    # The first request ran before any node reported watts; the second used 42 W.
    assert list(view.energy_curve.getData()[1]) == [42.0 / 50.0]
    assert view.power_note.text() == ""
    # the placement's predicted joules per token sit beside what was measured
    assert not view.energy_predicted.isVisible()
    view.set_predicted_energy(1.2)
    assert view.energy_predicted.isVisible() and view.energy_predicted.value() == 1.2
    view.set_predicted_energy(None)  # a node's watts unknown: nothing predicted
    assert not view.energy_predicted.isVisible()

    metrics.add_cards(node_cards(topology(None)))
    view.tick()
    assert view.power_note.text() == "No power reading from mini, studio at the moment."
    assert "no RAPL counters" in view.power_note.toolTip()
    assert view.power.isVisibleTo(view)  # what was measured stays on the chart
    low, high = view.tps.viewRange()[0]  # the last 120 s, and a little room after now
    assert abs(low - (clock.now - 120)) < 1 and 2 < high - clock.now < 10

    # Figures older than the window scroll out.
    clock.now += 200
    metrics.add_request({"generation_tps": 45.0, "ttft_s": 0.3})
    view.tick()
    assert list(view.tps_curve.getData()[1]) == [45.0]


def test_charts_show_streams_in_flight_and_cache_reuse(qtbot):
    clock = Clock()
    metrics = Metrics(window_s=120, clock=clock)
    view = ChartsView(metrics)
    qtbot.addWidget(view)
    # the status as the app keeps it (its JSON), and what it makes while the node is away
    metrics.add_status(StatusInfo.from_json({"state": "generating", "streams": {
        "in_flight": 3, "waiting": 1, "max": 8}}).to_json())
    clock.now += 1
    metrics.add_status({"state": "idle", "streams": {"in_flight": 0, "waiting": 0, "max": 8}})
    metrics.add_status({"state": "unreachable"})  # no figures: nothing is added
    metrics.add_request({"generation_tps": 40.0, "ttft_s": 0.2, "cached_tokens": 1480})
    metrics.add_request({"generation_tps": 40.0, "ttft_s": 0.9, "drafted_tokens": 30,
                         "accepted_tokens": 24})
    view.tick()
    # A count drawn as steps: flat, then a jump where it changed (no diagonals).
    assert list(view.in_flight_curve.getData()[1]) == [3.0, 3.0, 0.0]
    assert list(view.in_flight_curve.getData()[0]) == [clock.now - 1, clock.now, clock.now]
    assert list(view.waiting_curve.getData()[1]) == [1.0, 1.0, 0.0]
    assert list(view.cached_curve.getData()[1]) == [1480]
    assert list(view.drafts_curve.getData()[1]) == [24]  # the request that drafted


def test_power_charts_hide_when_no_node_measures_it(qtbot):
    clock = Clock()
    metrics = Metrics(window_s=120, clock=clock)
    view = ChartsView(metrics)
    qtbot.addWidget(view)
    view.resize(900, 700)
    view.show()
    metrics.add_cards(node_cards(topology(None)))
    view.tick()
    assert not view.power.isVisibleTo(view) and not view.energy.isVisibleTo(view)
    assert view.memory.isVisibleTo(view)
    line = view.power_note.text()
    assert line.startswith("Power and energy per token aren't shown: no node measures")
    assert "RAPL" not in line.split("(")[0] and "mini: no RAPL counters" in \
        view.power_note.toolTip()  # the drivers' words only on hover

    metrics.add_cards(node_cards(topology(25.0)))
    view.tick()
    assert view.power.isVisibleTo(view) and view.energy.isVisibleTo(view)


def test_charts_reflow_to_the_width_there_is(qtbot):
    view = ChartsView(Metrics(clock=Clock()))
    qtbot.addWidget(view)
    view.show()
    view.resize(900, 600)
    qtbot.waitUntil(lambda: view.columns == 1)
    view.resize(1300, 800)
    qtbot.waitUntil(lambda: view.columns == 2)
    assert view.minimumSizeHint().width() <= 900


def test_the_streaming_marker_goes_when_the_reply_stops(qtbot):
    metrics = Metrics(clock=Clock())
    view = ChartsView(metrics)
    qtbot.addWidget(view)
    metrics.add_live(tokens=11, seconds=0.5)
    view.tick()
    assert len(view.live_curve.getData()[1]) == 1
    metrics.end_live()  # Stop: no finished figures come, the marker goes all the same
    view.tick()
    assert view.live_curve.getData()[1] is None or len(view.live_curve.getData()[1]) == 0


def test_legends_sit_below_the_plot_and_the_live_marker_is_whole(qtbot):
    clock = Clock()
    metrics = Metrics(window_s=120, clock=clock)
    view = ChartsView(metrics)
    qtbot.addWidget(view)
    view.resize(900, 700)
    view.show()
    metrics.add_request({"generation_tps": 40.0, "ttft_s": 0.2})
    clock.now += 3
    metrics.add_live(tokens=31, seconds=0.5)  # 60 tokens/s: the newest and highest point
    view.tick()
    box = view.tps.getPlotItem().getViewBox()

    def settled():
        legend = view.tps.getPlotItem().legend.sceneBoundingRect()
        return legend.height() > 0 and legend.top() >= box.sceneBoundingRect().bottom()
    qtbot.waitUntil(settled, timeout=3000)
    for p in view.shown_plots():
        legend = p.getPlotItem().legend
        if legend.items:
            assert not legend.sceneBoundingRect().intersects(
                p.getPlotItem().getViewBox().sceneBoundingRect()), p.chart_title

    def whole():  # the marker's centre at least half its 10 px from every edge
        marker = box.mapViewToScene(pg.Point(clock.now, 60.0))
        return box.sceneBoundingRect().adjusted(5, 5, -5, -5).contains(marker)
    qtbot.waitUntil(whole, timeout=3000)


def test_an_empty_chart_says_so(qtbot):
    clock = Clock()
    metrics = Metrics(window_s=120, clock=clock)
    view = ChartsView(metrics)
    qtbot.addWidget(view)
    view.show()
    view.tick()
    assert view.tps.empty_label.isVisible() and view.tps.empty_label.text == "No requests yet"
    assert view.memory.empty_label.text == "No readings yet"
    metrics.add_request({"generation_tps": 40.0, "ttft_s": 0.2})
    view.tick()
    assert not view.tps.empty_label.isVisible() and not view.ttft.empty_label.isVisible()
    assert view.memory.empty_label.isVisible()  # still nothing measured there
