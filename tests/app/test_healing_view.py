"""The launch panel after a node is lost, against a real two-node cluster on loopback: the
model runs over both, node b is killed, the owner places it again on node a alone and the
panel says so; when b is back the panel offers the original placement, and one click
runs it over both again."""

import os
import signal

from PySide6.QtCore import Qt
from test_launch_anyway import follow

from app.launch import LaunchPanel
from nodes import NodeProcess, start_cluster


def test_the_panel_shows_healing_and_offers_the_original_placement_back(
        qtbot, tmp_path, tiny_model_dir):
    a, b = nodes = start_cluster(tmp_path, tiny_model_dir, 2)
    tasks, state, monitor = follow(a)
    try:
        ida, idb = (n.client.status().cluster.id for n in nodes)
        panel = LaunchPanel(a.client, tasks, state)
        qtbot.addWidget(panel)
        panel.resize(1000, 300)
        panel.show()
        panel.set_placement("tiny-llama", "pipeline", "ring",
                            [(ida, (0, 2)), (idb, (2, 4))])
        qtbot.mouseClick(panel.launch_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state_text in ("Ready", "Failed"), timeout=90000)
        assert panel.state_text == "Ready", panel.headline.text()
        assert not panel.heal_label.isVisible()

        os.killpg(b.proc.pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: "runs again without" in panel.heal_label.text(),
                        timeout=60000)
        assert panel.heal_label.isVisible() and not panel.restore_button.isVisible()
        # the tiny model fits on node a alone: it runs there, and the panel says so
        qtbot.waitUntil(lambda: "without the node that was lost" in panel.headline.text(),
                        timeout=30000)
        assert panel.state_text == "Ready" and list(panel.rows) == [ida]

        nodes[1] = b = NodeProcess(b.home, "none", *b.extra, port=b.port,
                                   cluster_port=b.cluster_port).wait_healthy()
        qtbot.waitUntil(panel.restore_button.isVisible, timeout=40000)
        assert "is back" in panel.heal_label.text()
        qtbot.mouseClick(panel.restore_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state_text in ("Ready", "Failed") and
                        panel.launching is None and len(panel.rows) == 2, timeout=90000)
        assert panel.state_text == "Ready", panel.headline.text()
        inst = a.client.status().cluster.instances[0]
        assert inst.state == "ready" and [r.node for r in inst.ranks] == [ida, idb]
        qtbot.waitUntil(lambda: not panel.heal_label.isVisible(), timeout=10000)
    finally:
        state.stop()
        monitor.stop()
        tasks.cancel_streams()
        assert tasks.wait(20000)
        for n in nodes:
            n.stop()
