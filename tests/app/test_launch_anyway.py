"""A launch the memory check refuses can be forced from the window: a real node whose
memory limit is far below the model's needs refuses the launch with the figures, the
panel says what launching anyway risks and offers it, and the forced launch comes up
(its worker then admits only requests that fit, here none: a 503 saying why)."""

import httpx
from PySide6.QtCore import Qt

from app.cluster_state import ClusterState
from app.launch import LaunchPanel
from app.status import StatusMonitor
from app.tasks import Tasks
from nodes import NodeProcess, home_with


def follow(node):
    """Tasks and a ClusterState following `node` (polled fast), as the app wires them."""
    tasks = Tasks(max_threads=8)
    state = ClusterState(tasks, node.client, interval=0.3)
    monitor = StatusMonitor(tasks, node.url, interval=0.3)
    monitor.changed.connect(state.set_status)
    state.start()
    monitor.start()
    return tasks, state, monitor


def unfollow(node, tasks, state, monitor):
    state.stop()
    monitor.stop()
    tasks.cancel_streams()
    tasks.wait(20000)
    node.stop()


def test_a_refused_launch_can_be_forced_with_the_risk_said(qtbot, tmp_path, tiny_model_dir):
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "none",
                       "--memory-limit", "0.0001").wait_healthy()
    tasks, state, monitor = follow(node)
    try:
        qtbot.waitUntil(lambda: state.self_id is not None, timeout=10000)
        panel = LaunchPanel(node.client, tasks, state)
        qtbot.addWidget(panel)
        panel.show()
        panel.set_placement("tiny-llama", "pipeline", "ring", [(state.self_id, (0, 4))])
        qtbot.mouseClick(panel.launch_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state_text in ("Ready", "Failed"), timeout=60000)
        assert panel.state_text == "Failed"
        text = panel.headline.text()
        assert "GB" in text and "Launching anyway risks" in text
        assert panel.force_button.isVisible()
        qtbot.mouseClick(panel.force_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state_text in ("Ready", "Failed"), timeout=60000)
        assert panel.state_text == "Ready", panel.headline.text()
        assert not panel.force_button.isVisible()
        r = httpx.post(node.url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4})
        assert r.status_code == 503 and "left" in r.json()["error"]["message"]
    finally:
        unfollow(node, tasks, state, monitor)


def totals_at(model_dir, context: int) -> dict[int, int]:
    """The planner's memory total of one rank holding all of the model, per KV bits: the
    same function the node plans with, on a node with room to spare."""
    import json

    from engine.hub.checkpoint import memory_bytes
    from engine.node.planning import plan_from_cluster

    config = json.loads((model_dir / "config.json").read_text())
    out = {}
    for bits in (16, 8):
        report = plan_from_cluster(
            [{"id": "x", "name": "x", "memory_usable_bytes": 10**12}], config,
            context=context, weight_bytes=memory_bytes(model_dir, config),
            layout=("pipeline", "ring", [{"node": "x", "layers": [0, 4]}]),
            kv_bits=None if bits == 16 else bits)
        out[bits] = report.placements[0].ranks[0].memory.total
    return out


def test_a_placement_that_fits_only_with_8_bit_kv_offers_it(qtbot, tmp_path):
    """A node whose memory holds the model at 4K context with 8-bit KV but not 16: the
    placement view says it can't run, offers 8-bit KV once the planner says that fits,
    and with it chosen the plan fits and the launch comes up with 8-bit KV."""
    from app.placement import PlacementView
    from tiny import make_tiny_model

    wide = make_tiny_model(tmp_path / "models" / "wide-llama", hidden_size=256)  # 64-wide
    t = totals_at(wide, 4096)                                                   # heads
    assert t[8] < t[16]
    limit_gb = (t[8] + t[16]) / 2 / 1e9
    node = NodeProcess(home_with(tmp_path, wide), "none",
                       "--memory-limit", f"{limit_gb:.9f}").wait_healthy()
    tasks, state, monitor = follow(node)
    try:
        view = PlacementView(node.client, tasks, state, node.home / "logs")
        qtbot.addWidget(view)
        view.resize(1000, 800)
        view.show()
        view.context_spin.setValue(4096)
        view._context_edited()  # as when the user leaves the field
        view.refresh_models()
        qtbot.waitUntil(lambda: view.kv_offer.isVisible(), timeout=20000)
        assert view.prediction is None and "can't run" in view.headline.text()
        assert view.kv_offer.text.text() == "It fits 4k context with 8-bit KV cache."
        assert view.kv_box.itemText(0) == "Default (16-bit)"
        qtbot.mouseClick(view.kv_offer.button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: view.prediction is not None, timeout=20000)
        assert view.kv_box.bits == 8 and not view.kv_offer.isVisible()
        assert view.last_request["context"] == 4096
        qtbot.mouseClick(view.launch.launch_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: view.launch.state_text in ("Ready", "Failed"),
                        timeout=60000)
        assert view.launch.state_text == "Ready", view.launch.headline.text()
        assert view.launch.instance["kv_bits"] == 8
        # what a person reads says machines and layers, not nodes, ranks or pipelines
        words = [view.launch.headline.text(), view.node_list.item(0).text(),
                 *(view.strategy_box.itemText(i) for i in range(view.strategy_box.count()))]
        assert "Ready: wide-llama runs on 1 machine." in words[0], words
        assert words[1].endswith("(this machine: it answers the chat)"), words
        assert words[2].startswith("Split by layers"), words
        for text in words:
            assert not any(w in text.lower() for w in ("node", "rank", "pipeline", "lanes")), \
                text
    finally:
        unfollow(node, tasks, state, monitor)
