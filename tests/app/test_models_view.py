"""The models view against a real node whose Hugging Face Hub is the tests' local stand-in
(tests/hubserver.py): the catalog and search, a download with progress that is
cancelled, then resumed to the end, after which the model is on the node's list."""

import pytest
from PySide6.QtCore import Qt

from app.cluster_state import ClusterState
from app.models_view import NO_HUB, ModelsView
from app.tasks import Tasks
from hubserver import HubServer
from nodes import NodeProcess

REPO = "test-org/tiny-llama"


@pytest.fixture
def hub_node(tmp_path, tiny_model_dir, monkeypatch):
    hub = HubServer(rate_bps=150_000)  # slow enough to watch and cancel
    hub.add_repo(REPO, tiny_model_dir)
    hub.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    node = NodeProcess(tmp_path / "home", "none").wait_healthy()
    yield hub, node
    node.stop()
    hub.stop()


@pytest.fixture
def make_view(qtbot):
    tasks = Tasks()
    made = []

    def make(node):
        view = ModelsView(node.client, tasks, ClusterState(tasks, node.client))
        qtbot.addWidget(view)
        view.resize(1000, 700)
        view.show()
        view.start()
        made.append(view)
        return view

    yield make
    for view in made:
        view.stop()
    assert tasks.wait(20000)


def rows(table):
    return [table.item(i, 0).text() for i in range(table.rowCount()) if table.item(i, 0)]


def download_state(view):
    return [d["state"] for d in view.downloads if d["repo"] == REPO]


def test_search_download_cancel_and_resume(qtbot, hub_node, make_view):
    hub, node = hub_node
    view = make_view(node)
    qtbot.waitUntil(lambda: view.hub_available is True and len(view.catalog) > 0,
                    timeout=20000)
    assert view.local == []

    view.search_edit.setText("tiny")
    qtbot.keyClick(view.search_edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: REPO in rows(view.catalog_table), timeout=20000)
    row = rows(view.catalog_table).index(REPO)
    with qtbot.waitSignal(view.downloading_changed, timeout=20000) as started:
        qtbot.mouseClick(view.catalog_table.cellWidget(row, 6), Qt.MouseButton.LeftButton)
    assert started.args == [True]

    # Progress shows while it runs; Cancel stops it.
    table = view.downloads_table
    qtbot.waitUntil(lambda: table.rowCount() and table.cellWidget(0, 1).value() > 0,
                    timeout=20000)
    assert table.item(0, 0).text() == REPO and "/s" in table.item(0, 2).text()
    assert "kB /" in table.cellWidget(0, 1).format()
    qtbot.mouseClick(table.cellWidget(0, 5), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: download_state(view)[:1] == ["cancelled"], timeout=20000)
    assert not view.downloading

    # Downloading again resumes and finishes; the model is then on the node.
    hub.rate_bps = None
    assert rows(view.catalog_table)[row] == REPO  # the search results stayed
    qtbot.mouseClick(view.catalog_table.cellWidget(row, 6), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: download_state(view)[:1] == ["done"], timeout=30000)
    qtbot.waitUntil(lambda: any(m["id"] == REPO for m in view.local), timeout=20000)
    assert REPO in rows(view.local_table)


def test_a_node_without_the_hub_routes_says_so(qtbot, make_view, tiny_node, monkeypatch):
    # As an older node answers: no such route.
    monkeypatch.setattr(tiny_node.client, "hub_catalog", lambda: (_ for _ in ()).throw(
        _missing_route()))
    view = make_view(tiny_node)
    qtbot.waitUntil(lambda: view.hub_available is False, timeout=20000)
    assert view.hub_message.text() == NO_HUB and not view.search_button.isEnabled()
    qtbot.waitUntil(lambda: "tiny-llama" in rows(view.local_table), timeout=20000)


def _missing_route():
    from engine.errors import ShoalError
    e = ShoalError("Not Found: GET /shoal/hub/catalog", code="404")
    e.status = 404
    return e
