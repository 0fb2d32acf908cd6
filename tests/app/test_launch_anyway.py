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


def test_a_refused_launch_can_be_forced_with_the_risk_said(qtbot, tmp_path, tiny_model_dir):
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "none",
                       "--memory-limit", "0.0001").wait_healthy()
    tasks = Tasks(max_threads=8)
    state = ClusterState(tasks, node.client, interval=0.3)
    monitor = StatusMonitor(tasks, node.url, interval=0.3)
    monitor.changed.connect(state.set_status)
    state.start()
    monitor.start()
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
        state.stop()
        monitor.stop()
        tasks.cancel_streams()
        tasks.wait(20000)
        node.stop()
