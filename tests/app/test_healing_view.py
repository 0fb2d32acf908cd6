"""The launch panel after a machine is lost, against a real two-node cluster on loopback
(mac-a, the app's own node, and mac-b): the model runs split by layers over both, mac-b is
killed, the owner places it again on mac-a alone and the panel says so in plain words,
with how long it should take; mac-b's row says it isn't answering instead of Loaded. When
mac-b is back the panel offers the user's own split, and one click runs it again."""

import json
import os
import signal

from PySide6.QtCore import Qt
from test_launch_anyway import follow

from app.launch import LaunchPanel
from nodes import NodeProcess, start_cluster


def test_the_panel_shows_healing_and_offers_the_users_split_back(
        qtbot, tmp_path, tiny_model_dir):
    for i, name in enumerate(("mac-a", "mac-b")):
        home = tmp_path / f"node{i}" / "home"
        home.mkdir(parents=True)
        (home / "node.json").write_text(json.dumps({"id": f"{name}-id", "name": name}))
    a, b = nodes = start_cluster(tmp_path, tiny_model_dir, 2)
    tasks, state, monitor = follow(a)
    try:
        ida, idb = "mac-a-id", "mac-b-id"
        panel = LaunchPanel(a.client, tasks, state)
        qtbot.addWidget(panel)
        panel.resize(1000, 300)
        panel.show()
        headlines: list[str] = []  # every headline the panel showed, in order
        state.changed.connect(lambda: headlines.append(panel.headline.text()))
        qtbot.waitUntil(lambda: len(state.cards()) == 2, timeout=20000)
        panel.set_placement("tiny-llama", "pipeline", "ring",
                            [(ida, (0, 2)), (idb, (2, 4))])
        qtbot.mouseClick(panel.launch_button, Qt.MouseButton.LeftButton)
        assert panel.headline.text() == "Launching tiny-llama on 2 machines, split by layers…"
        qtbot.waitUntil(lambda: panel.state_text in ("Ready", "Failed"), timeout=90000)
        assert panel.state_text == "Ready", panel.headline.text()
        assert "runs on 2 machines, split by layers" in panel.headline.text()
        assert not panel.heal_label.isVisible()

        os.killpg(b.proc.pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: panel.headline.text().startswith("Running again without"),
                        timeout=60000)
        placing = [h for h in headlines if h.startswith("Placing tiny-llama again on mac-a")]
        assert placing and placing[0].endswith(" s."), headlines  # "…, about 9 s."
        assert panel.headline.text() == "Running again without mac-b: tiny-llama on mac-a."
        assert "is running again without mac-b, on mac-a" in panel.heal_label.text()
        assert not panel.restore_button.isVisible()
        assert panel.stop_button.isEnabled()  # the copy healing put here can be stopped
        assert list(panel.rows) == [ida, idb]
        assert panel.rows[ida].text.text() == "Loaded"
        assert panel.rows[idb].text.text() == "Not answering"  # not Loaded, once it is gone
        for text in (panel.headline.text(), panel.heal_label.text()):
            assert "node" not in text and "rank" not in text and ida not in text, text

        nodes[1] = b = NodeProcess(b.home, "none", *b.extra, port=b.port,
                                   cluster_port=b.cluster_port).wait_healthy()
        qtbot.waitUntil(panel.restore_button.isVisible, timeout=40000)
        assert panel.restore_button.text() == "Use my split again"
        assert panel.heal_label.text().startswith("mac-b is back")
        assert panel.rows[idb].text.text() == "Back, not in use"
        qtbot.mouseClick(panel.restore_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state_text in ("Ready", "Failed") and
                        panel.launching is None and len(panel.rows) == 2, timeout=90000)
        assert panel.state_text == "Ready", panel.headline.text()
        inst = a.client.status().cluster.instances[0]
        assert inst.state == "ready" and [r.node for r in inst.ranks] == [ida, idb]
        assert [r.layers for r in inst.ranks] == [[0, 2], [2, 4]]
        qtbot.waitUntil(lambda: not panel.heal_label.isVisible(), timeout=10000)
        assert all(row.text.text() == "Loaded" for row in panel.rows.values())
    finally:
        state.stop()
        monitor.stop()
        tasks.cancel_streams()
        assert tasks.wait(20000)
        for n in nodes:
            n.stop()
