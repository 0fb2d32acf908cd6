"""The models view against a real node whose Hugging Face Hub is the tests' local stand-in
(tests/hubserver.py): the catalog and search, a download with progress that is
cancelled, then "Download and chat" to the end, after which the model is on the node's
list and the chat is asked for it; offline, one calm line; a download the Hub can't serve
fails at once with its reason in view and a Retry; deleting a model asks first."""

import time

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.cluster_state import ClusterState
from app.models_view import NO_HUB, ModelsView
from app.tasks import Tasks
from engine.records import CatalogInfo, CatalogModel, FilesAt, RemovedInfo
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


def rows(view):
    return view.shown_models()


def download_state(view):
    return [d.state for d in view.downloads if d.repo == REPO]


def test_search_download_cancel_then_download_and_chat(qtbot, hub_node, make_view):
    hub, node = hub_node
    view = make_view(node)
    qtbot.waitUntil(lambda: view.hub_available is True and len(view.catalog) > 0,
                    timeout=20000)
    assert view.local == []
    assert "Qwen3" in [view.tree.topLevelItem(i).text(0)
                       for i in range(view.tree.topLevelItemCount())]  # grouped by family

    view.search_edit.setText("tiny")
    qtbot.keyClick(view.search_edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: REPO in rows(view), timeout=20000)
    assert rows(view) == [REPO]  # the filter hides the catalog's other models
    with qtbot.waitSignal(view.downloading_changed, timeout=20000) as started:
        qtbot.mouseClick(view.action_button(REPO), Qt.MouseButton.LeftButton)
    assert started.args == [True]

    # Progress shows while it runs, in the tray's line too; Cancel stops it.
    panel = view.downloads_panel
    table = panel.table
    qtbot.waitUntil(lambda: table.rowCount() and table.cellWidget(0, 1).value() > 0,
                    timeout=20000)
    assert table.item(0, 0).text() == REPO and "/s" in table.item(0, 2).text()
    assert "kB /" in panel.status(0)
    assert panel.action(0).text() == "Cancel"
    qtbot.mouseClick(panel.action(0), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: download_state(view)[:1] == ["cancelled"], timeout=20000)
    assert not view.downloading
    assert panel.status(0).startswith("Cancelled at ") and panel.action(0).text() == "Resume"
    assert not panel.banner.isVisible()  # cancelled by the user: nothing went wrong

    # Download and chat: it resumes, finishes, and then the chat is asked for the model.
    hub.rate_bps = None
    assert REPO in rows(view)  # the search results stayed
    button = view.action_button(REPO)
    assert button.text() == "Download and chat"
    with qtbot.waitSignal(view.chat_requested, timeout=30000) as chat:
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert chat.args == [REPO]
    qtbot.waitUntil(lambda: any(m.id == REPO for m in view.local), timeout=20000)
    qtbot.waitUntil(lambda: "downloaded" in view.badges_of(REPO), timeout=20000)
    assert view.action_button(REPO).text() == "Chat"


def test_offline_is_one_calm_line(qtbot, tmp_path, make_view, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing answers there
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    node = NodeProcess(tmp_path / "home", "none").wait_healthy()
    try:
        view = make_view(node)
        qtbot.waitUntil(lambda: view.hub_available is True, timeout=20000)
        view.search_edit.setText("qwen")
        qtbot.keyClick(view.search_edit, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: view.offline, timeout=30000)
        line = view.hub_message.text()
        assert "Offline" in line and "Error" not in line and "http" not in line
        assert view.hub_message.property("role") == "muted"  # calm, not a warning
        assert rows(view) and all("qwen" in m.lower() for m in rows(view))
    finally:
        node.stop()


def test_a_download_the_hub_cannot_serve_says_why_at_once_with_retry(
        qtbot, tmp_path, make_view, monkeypatch, port):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # a closed port
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    node = NodeProcess(tmp_path / "home", "none").wait_healthy()
    try:
        view = make_view(node)
        qtbot.waitUntil(lambda: view.hub_available is True and len(rows(view)) > 0,
                        timeout=30000)
        repo = next(m for m in rows(view) if (b := view.action_button(m)) is not None
                    and b.isEnabled() and b.text().startswith("Download"))
        panel = view.downloads_panel
        clicked = time.monotonic()
        qtbot.mouseClick(view.action_button(repo), Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.banner.isVisible(), timeout=10000)
        print(f"failure shown {time.monotonic() - clicked:.2f} s after the click")
        name = repo.split("/")[-1]
        text = panel.banner_text.text()
        assert text.startswith(f"Couldn't download {name}: ") and "Hugging Face" in text
        assert panel.status(0) == "Failed" and panel.action(0).text() == "Retry"
        # in view: the banner lies inside the window, above the list, and wraps
        top = panel.banner_text.mapTo(view, panel.banner_text.rect().bottomRight())
        assert view.rect().contains(top) and panel.banner_text.wordWrap()
        assert panel.note.details_button.isVisible()  # the node's own text, a click away

        # Retry pulls again (through the real node), and says again why it failed.
        qtbot.mouseClick(panel.retry_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len([d for d in view.downloads if d.repo == repo]) == 2
                        and view.downloads[0].state == "failed" and panel.banner.isVisible(),
                        timeout=10000)
        assert panel.status(0) == "Failed" and panel.status(1) == "Failed"
    finally:
        node.stop()


def test_a_node_without_the_hub_routes_says_so(qtbot, make_view, tiny_node, monkeypatch):
    # As an older node answers: no such route.
    monkeypatch.setattr(tiny_node.client, "hub_catalog", lambda: (_ for _ in ()).throw(
        _missing_route()))
    view = make_view(tiny_node)
    qtbot.waitUntil(lambda: view.hub_available is False, timeout=20000)
    assert view.hub_message.text() == NO_HUB and not view.search_button.isEnabled()
    qtbot.waitUntil(lambda: "tiny-llama" in rows(view), timeout=20000)


def _missing_route():
    from engine.errors import ShoalError
    e = ShoalError("Not Found: GET /shoal/hub/catalog", code="404")
    e.status = 404
    return e


class Catalog:
    """A node client with a catalog, which gains the default model once it is imported."""

    base_url = "http://127.0.0.1:9"  # never polled: the test asks for the list itself

    def __init__(self):
        self.entries = [CatalogModel("mlx-community/Qwen3-4B-4bit", "Qwen3 4B",
                                     size_bytes=2 * 10**9, quantization="4bit")]

    def models(self):
        return []

    def hub_catalog(self):
        return CatalogInfo(list(self.entries))


def test_a_model_made_ready_joins_the_list_as_downloaded(qtbot):
    tasks = Tasks()
    client = Catalog()
    view = ModelsView(client, tasks, ClusterState(tasks, client))
    qtbot.addWidget(view)
    view.refresh()
    qtbot.waitUntil(lambda: rows(view) == ["mlx-community/Qwen3-4B-4bit"], timeout=5000)
    # The node finishes importing the bundled model on first run and loads it.
    client.entries.insert(0, CatalogModel("SmolLM2-135M-Instruct", source="local",
                                          local=[FilesAt("shoal", "/m/SmolLM2")]))
    view.follow_status({"state": "idle", "runner": {"type": "Ready",
                                                    "model": "SmolLM2-135M-Instruct"}})
    qtbot.waitUntil(lambda: "SmolLM2-135M-Instruct" in rows(view), timeout=5000)
    assert view.tree.topLevelItem(0).text(0) == "SmolLM2"  # downloaded models come first
    assert "downloaded" in view.badges_of("SmolLM2-135M-Instruct")
    assert view.action_button("SmolLM2-135M-Instruct").text() == "Chat"
    assert tasks.wait(5000)


class Deletable(Catalog):
    """A catalog whose one model is downloaded, and can be deleted."""

    def __init__(self):
        self.entries = [CatalogModel("mlx-community/Qwen3-8B-4bit", "Qwen3 8B",
                                     size_bytes=16_400_000_000, quantization="4bit",
                                     local=[FilesAt("hf-cache", "/hf/qwen3-8b")])]
        self.removed = []

    def remove_model(self, model):
        self.removed.append(model)
        self.entries = []
        return RemovedInfo(model, 16_400_000_000)


def test_deleting_a_model_asks_first_with_its_size(qtbot):
    tasks = Tasks()
    client = Deletable()
    view = ModelsView(client, tasks, ClusterState(tasks, client))
    qtbot.addWidget(view)
    view.refresh()
    model = "mlx-community/Qwen3-8B-4bit"
    qtbot.waitUntil(lambda: "downloaded" in view.badges_of(model), timeout=5000)

    view.delete(model)
    box = view.delete_box
    assert box.isVisible() and box.text() == ("Delete Qwen3-8B-4bit (16.4 GB)? This "
                                              "removes the files from this computer.")
    qtbot.mouseClick(box.button(QMessageBox.StandardButton.Cancel),
                     Qt.MouseButton.LeftButton)
    assert view.delete_box is None and client.removed == []  # nothing happened

    view.delete(model)
    (delete,) = [b for b in view.delete_box.buttons() if b.text() == "Delete"]
    qtbot.mouseClick(delete, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: client.removed == [model], timeout=5000)
    qtbot.waitUntil(lambda: model not in rows(view), timeout=5000)
    assert view.hub_message.text() == ("Deleted mlx-community/Qwen3-8B-4bit (16.4 GB freed)."
                                       " 0 models.")
    assert tasks.wait(5000)
