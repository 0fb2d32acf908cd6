"""The topology, placement and launch views against a real two-node cluster on loopback
(real `shoal node` processes with the tiny model): nodes appear and vanish, dragging a
boundary changes what the planner is asked and what it predicts, Launch then chat
streams text from the model spread over both nodes, Stop stops it, and a launch that
fails names the node with its log one click away."""

import re
import shutil
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QPoint, QSettings, Qt

from app.chat import ChatPane
from app.cluster_state import ClusterState
from app.conversations import ConversationStore
from app.placement import PlacementView
from app.settings import SettingsDialog
from app.status import StatusMonitor
from app.tasks import Tasks
from app.topology import TopologyView
from nodes import NodeProcess, home_with

SECRET = "test-cluster-secret"  # start_cluster's default


@pytest.fixture
def views(qtbot, cluster):
    """A ClusterState following the first node (polled fast), as the app wires it."""
    tasks = Tasks(max_threads=12)
    state = ClusterState(tasks, cluster[0].client, interval=0.3)
    monitor = StatusMonitor(tasks, cluster[0].url, interval=0.3)
    monitor.changed.connect(state.set_status)
    state.start()
    monitor.start()
    yield SimpleNamespace(tasks=tasks, state=state, nodes=cluster)
    state.stop()
    monitor.stop()
    tasks.cancel_streams()
    assert tasks.wait(20000)


def card_kinds(view):
    return {nid: item.card.kind for nid, item in view.cards.items()}


def test_topology_follows_a_node_that_starts_and_stops(qtbot, views, tmp_path, tiny_model_dir):
    a, b = views.nodes
    ida, idb = (nd.client.status().cluster.id for nd in (a, b))
    view = TopologyView(views.state)
    qtbot.addWidget(view)
    view.resize(900, 600)
    view.show()
    qtbot.waitUntil(lambda: card_kinds(view) == {ida: "ok", idb: "ok"}, timeout=10000)
    qtbot.waitUntil(lambda: len(view.edges) == 1, timeout=10000)
    (edge,) = view.edges.values()
    assert re.fullmatch(r"Loopback · [\d.]+ ms · [\d.]+ [MG]B/s", edge.label.text())
    assert "(this machine)" in view.cards[ida].lines()[0]

    # A third machine starts; the user adds it as a peer in the settings: it appears.
    c = NodeProcess(home_with(tmp_path / "third", tiny_model_dir), "none", "--secret", SECRET)
    try:
        c.wait_healthy()
        idc = c.client.status().cluster.id
        settings = QSettings(str(tmp_path / "app.ini"), QSettings.Format.IniFormat)
        dialog = SettingsDialog(tmp_path, settings, a.client, views.tasks,
                                tray_available=False)
        qtbot.addWidget(dialog)
        dialog.peer_edit.setText(f"127.0.0.1:{c.cluster_port}")
        qtbot.mouseClick(dialog.add_peer_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: "Added" in dialog.peer_message.text(), timeout=10000)
        qtbot.waitUntil(lambda: card_kinds(view).get(idc) == "ok", timeout=15000)
        assert len(view.cards) == 3
        qtbot.waitUntil(lambda: any(idc in key for key in view.edges), timeout=15000)
        assert view.cards[idc].card.memory is not None
    finally:
        c.stop()
    # ... and when its process is gone, its card goes offline (it stays remembered), with
    # none of what it last said: no memory bar, no state, no link.
    qtbot.waitUntil(lambda: card_kinds(view).get(idc) == "offline", timeout=15000)
    gone = view.cards[idc]
    assert not gone.card.usable and gone.opacity() < 1
    assert gone.card.memory is None and gone.card.state is None
    assert "no figures while it is offline" in gone.lines()
    assert not any(idc in key for key in view.edges)
    assert card_kinds(view)[idb] == "ok"


@pytest.fixture
def placement(qtbot, views):
    view = PlacementView(views.nodes[0].client, views.tasks, views.state,
                         views.nodes[0].home / "logs")
    qtbot.addWidget(view)
    view.resize(1000, 800)
    view.show()
    view.refresh_models()
    qtbot.waitUntil(lambda: view.prediction is not None, timeout=20000)
    # Both usable nodes, in a pipeline.
    qtbot.waitUntil(lambda: sum(1 for i in range(view.node_list.count())
                                if view.node_list.item(i).flags() &
                                Qt.ItemFlag.ItemIsEnabled) >= 2, timeout=10000)
    for i in range(view.node_list.count()):
        item = view.node_list.item(i)
        if item.flags() & Qt.ItemFlag.ItemIsUserCheckable:
            item.setCheckState(Qt.CheckState.Checked)
    qtbot.waitUntil(lambda: view.prediction is not None and len(view.prediction["ranks"]) == 2,
                    timeout=10000)
    return view


def drag(qtbot, strips, boundary, to_layer):
    start = strips.handle_point(boundary).toPoint()
    end = QPoint(round(strips.x_of(to_layer)), start.y())
    qtbot.mousePress(strips, Qt.MouseButton.LeftButton, pos=start)
    qtbot.mouseMove(strips, QPoint((start.x() + end.x()) // 2, start.y()))
    qtbot.mouseMove(strips, end)
    qtbot.mouseRelease(strips, Qt.MouseButton.LeftButton, pos=end)


def rank_layers(prediction):
    return [tuple(r["layers"]) for r in prediction["ranks"]]


def test_dragging_a_boundary_changes_the_plan_and_the_prediction(qtbot, placement):
    view = placement
    assert rank_layers(view.prediction) == [(0, 2), (2, 4)]  # the planner's even split
    before = [r["memory"]["weights"] for r in view.prediction["ranks"]]
    assert view.launch.launch_button.isEnabled()

    drag(qtbot, view.strips, 0, 1)
    assert view.strips.ranges == [(0, 1), (1, 4)]  # the strips follow the mouse at once
    qtbot.waitUntil(lambda: rank_layers(view.prediction or {"ranks": []}) == [(0, 1), (1, 4)],
                    timeout=10000)
    assert [n["layers"] for n in view.last_request["nodes"]] == [[0, 1], [1, 4]]
    after = [r["memory"]["weights"] for r in view.prediction["ranks"]]
    assert after[0] < before[0] and after[1] > before[1]
    assert "1–3" in view.table.item(1, 1).text()
    assert "tokens/s decode" in view.headline.text()

    # Leaving a node no layers can't run: the strips turn red with the planner's reason.
    drag(qtbot, view.strips, 0, 0)
    qtbot.waitUntil(lambda: view.reason is not None, timeout=10000)
    assert "empty" in view.reason_label.text() and view.reason_label.isVisible()
    assert not view.strips.feasible and not view.launch.launch_button.isEnabled()
    drag(qtbot, view.strips, 0, 2)
    qtbot.waitUntil(lambda: view.prediction is not None, timeout=10000)
    assert view.strips.feasible and view.launch.launch_button.isEnabled()


def test_the_first_token_is_predicted_and_the_best_can_be_for_agents(qtbot, placement):
    view = placement
    # the tiny model's 4K context holds the 1K-token prompt, not the 10K or the 50K one
    assert re.fullmatch(r"Predicted first token: [\d.]+ (s|min) at 1K tokens",
                        view.ttft_label.text()), view.ttft_label.text()
    asked = []
    real = view.client.plan
    view.client.plan = lambda *a, **k: asked.append(k.get("rank")) or real(*a, **k)
    try:
        view.rank_box.setCurrentIndex(view.rank_box.findData("agents"))
        qtbot.waitUntil(lambda: bool(asked) and not view._busy, timeout=10000)
    finally:
        del view.client.plan
    assert asked[0] == "agents" and view.prediction is not None
    assert view.ttft_label.text().startswith("Predicted first token: ")


def test_launch_then_chat_streams_then_stop(qtbot, placement, views, home):
    a, b = views.nodes
    launch = placement.launch
    qtbot.mouseClick(launch.launch_button, Qt.MouseButton.LeftButton)
    assert launch.state_text == "Launching…" and len(launch.rows) == 2
    qtbot.waitUntil(lambda: launch.state_text in ("Ready", "Failed"), timeout=90000)
    assert launch.state_text == "Ready", launch.headline.text()
    assert all(r.text.text() == "Loaded" for r in launch.rows.values())
    assert launch.stop_button.isEnabled()
    assert b.client.status().cluster.followers[0].state == "ready"

    pane = ChatPane(a.client, ConversationStore(home), views.tasks)
    qtbot.addWidget(pane)
    pane.model_picker.setCurrentText("tiny-llama")
    pane.chat_params = {"max_tokens": 8, "temperature": 0.0}
    pane.prompt.setPlainText("Hello, cluster")
    pane.send()
    reply = pane.view.widgets()[-1]
    qtbot.waitUntil(lambda: not pane.streaming, timeout=60000)
    assert reply.text() != "" and not reply.error_label.isVisible()
    assert "8 tokens" in reply.stats_label.text()

    qtbot.mouseClick(launch.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: launch.state_text == "Stopped", timeout=30000)
    (inst,) = a.client.status().cluster.instances
    assert inst.state == "stopped"
    qtbot.waitUntil(lambda: b.client.status().cluster.followers[0].state ==
                    "stopped", timeout=10000)
    assert not launch.stop_button.isEnabled() and launch.launch_button.isEnabled()


def test_failed_launch_names_the_node_and_shows_the_log(qtbot, placement, views):
    a, b = views.nodes
    b_id = b.client.status().cluster.id
    shutil.rmtree(b.home / "models" / "tiny-llama")  # the second node lost the model
    launch = placement.launch
    qtbot.mouseClick(launch.launch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: launch.state_text in ("Ready", "Failed"), timeout=60000)
    assert launch.state_text == "Failed"
    assert launch.failed_node == b_id
    assert "Launch failed on" in launch.headline.text() and "tiny-llama" in \
        launch.headline.text()
    row = launch.rows[b_id]
    assert row.text.text() == "Failed"
    assert launch.log_button.isVisible()
    qtbot.mouseClick(launch.log_button, Qt.MouseButton.LeftButton)
    dialog = launch.log_dialog
    assert dialog.isVisible() and dialog.path == a.home / "logs" / "node.log"
    assert b_id in dialog.text.toPlainText()  # the node's log recorded the refusal
