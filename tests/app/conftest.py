"""GUI test setup: offscreen Qt, no unexpected Qt warnings, a per-test home, and real node
command lines (nodes themselves come from tests/conftest.py)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists

import gc  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import QtMsgType  # noqa: E402

# Qt messages that say nothing about our code: the offscreen platform's own notes.
IGNORED_QT_MESSAGES = (
    "This plugin does not support propagateSizeHints()",
    "This plugin does not support raise()",  # MainWindow.show_and_raise (tray Show)
)


@pytest.fixture(autouse=True)
def no_qt_warnings(qtlog):
    """Fail the test if Qt logged a warning (or worse) we didn't expect."""
    yield
    bad = [r for r in qtlog.records
           if r.type in (QtMsgType.QtWarningMsg, QtMsgType.QtCriticalMsg, QtMsgType.QtFatalMsg)
           and not any(s in r.message for s in IGNORED_QT_MESSAGES)]
    if bad:
        pytest.fail("Unexpected Qt warnings:\n" + "\n".join(r.message for r in bad))


@pytest.fixture(autouse=True)
def collect_on_gui_thread():
    """Python's cycle collector runs on whichever thread happens to allocate; run it here
    after each test, so Qt objects a test leaves in reference cycles are destroyed on the
    GUI thread and not later, on some worker thread of the next test."""
    yield
    gc.collect()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "app_errors(*texts): errors the test provokes on "
                            "purpose; app error logs containing one of these are allowed")


@pytest.fixture(autouse=True)
def no_app_errors(caplog, request):
    """Fail the test if app code logged an error it didn't expect (see the app_errors
    marker): Tasks logs (not raises) exceptions from GUI callbacks so the app survives
    them, which would otherwise hide bugs from tests."""
    yield
    marker = request.node.get_closest_marker("app_errors")
    expected = marker.args if marker else ()
    # caplog.records holds only the current phase's (teardown's) records.
    records = caplog.get_records("setup") + caplog.get_records("call") + caplog.records
    bad = [r for r in records if r.name.startswith("app") and r.levelno >= 40
           and not any(text in r.getMessage() for text in expected)]
    if bad:
        pytest.fail("App logged errors:\n" + "\n".join(
            f"{r.name}: {r.getMessage()}\n{r.exc_text or ''}" for r in bad))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The app's state folder; also the home of the nodes it starts, as in real use."""
    h = tmp_path / "home"
    h.mkdir(exist_ok=True)  # fresh_node (tests/conftest.py) uses tmp_path/home too
    return h


@pytest.fixture
def make_app(qtbot, home: Path):
    """make(port, command=None, tray=False, **kw) -> a ShoalApp for this test's home that
    polls its node every 0.1 s (kw go to ShoalApp); each is shut down after the test."""
    from app.main import ShoalApp

    made = []

    def make(port: int, command: list[str] | None = None, tray: bool = False, **kw):
        shoal = ShoalApp(home, port, tray_available=tray, node_command=command,
                         status_interval=0.1, **kw)
        qtbot.addWidget(shoal.window)
        made.append(shoal)
        return shoal

    yield make
    for shoal in made:
        shoal.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    """A free local port."""
    return free_port()


@pytest.fixture
def node_command(home: Path, tiny_model_dir: Path):
    """make(port, model="none") -> the command line of a real `shoal node` for this test's
    home; model "tiny-llama" copies the tiny test model into the home first."""
    def make(port: int, model: str = "none") -> list[str]:
        if model == tiny_model_dir.name:
            shutil.copytree(tiny_model_dir, home / "models" / model, dirs_exist_ok=True)
        return [sys.executable, "-m", "engine.cli", "node", "--host", "127.0.0.1",
                "--port", str(port), "--home", str(home), "--model", model]
    return make


# A node that never answers: the real node can't be made to hang on purpose, so this
# stands in for it: a process that accepts connections on the port and never replies.
SILENT_LISTENER = """
import socket, sys
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
held = []
while True:
    held.append(server.accept())
"""


@pytest.fixture
def silent_command():
    """make(port) -> the command line of a process that listens on port, never answering."""
    return lambda port: [sys.executable, "-c", SILENT_LISTENER, str(port)]


@pytest.fixture
def port_holder(port: int):
    """A listening socket on `port` that is not a node and never answers (close it to free
    the port)."""
    with socket.create_server(("127.0.0.1", port)) as holder:
        yield holder


@pytest.fixture
def views(qtbot, planner):
    """The placement and topology views over a stand-in planner (each test file's
    `planner` fixture): (cluster state, placement view, topology view, planner)."""
    from app.cluster_state import ClusterState
    from app.placement import PlacementView
    from app.tasks import Tasks
    from app.topology import TopologyView

    tasks = Tasks()
    state = planner.state = ClusterState(tasks, planner)
    place = PlacementView(planner, tasks, state)
    topo = TopologyView(state)
    for w in (place, topo):
        qtbot.addWidget(w)
        w.resize(1000, 700)
        w.show()
    yield state, place, topo, planner
    assert tasks.wait(10000)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    """Two real nodes on loopback, each holding the tiny model: one pair a test module."""
    from nodes import start_cluster
    nodes = start_cluster(tmp_path_factory.mktemp("cluster"), tiny_model_dir, 2)
    yield nodes
    for nd in nodes:
        nd.stop()


@pytest.fixture
def placement_view(qtbot):
    """Opens the Placement tab on a real node, followed as the app follows it (a
    ClusterState polled fast), shown at 1000x800; stopped and waited for at the end."""
    from app.cluster_state import ClusterState
    from app.placement import PlacementView
    from app.tasks import Tasks

    opened = []

    def open_on(node):  # a tests/nodes.py NodeProcess
        tasks = Tasks(max_threads=8)
        state = ClusterState(tasks, node.client, interval=0.3)
        state.start()
        opened.append((state, tasks))
        place = PlacementView(node.client, tasks, state, node.home / "logs")
        qtbot.addWidget(place)
        place.resize(1000, 800)
        place.show()
        place.refresh_models()
        return place

    yield open_on
    for state, tasks in opened:
        state.stop()
        assert tasks.wait(20000)
