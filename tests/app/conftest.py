"""GUI test setup: offscreen Qt, no unexpected Qt warnings, a per-test home, and nodes."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists

import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import QtMsgType  # noqa: E402

from engine.client import NodeClient  # noqa: E402
from engine.errors import ShoalError  # noqa: E402

FAKE_NODE = Path(__file__).with_name("fake_node.py")

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
def no_app_errors(caplog):
    """Fail the test if app code logged an error: Tasks logs (not raises) exceptions from
    GUI callbacks so the app survives them, which would otherwise hide bugs from tests."""
    yield
    bad = [r for r in caplog.records if r.name.startswith("app") and r.levelno >= 40]
    if bad:
        pytest.fail("App logged errors:\n" + "\n".join(
            f"{r.name}: {r.getMessage()}\n{r.exc_text or ''}" for r in bad))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_node_command(port: int, home: Path, *extra: str) -> list[str]:
    return [sys.executable, str(FAKE_NODE), "node", "--host", "127.0.0.1",
            "--port", str(port), "--home", str(home), *extra]


def wait_answering(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    with NodeClient(url, timeout=1.0) as c:
        while True:
            try:
                c.health()
                return
            except ShoalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


class FakeNode:
    def __init__(self, home: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(fake_node_command(self.port, home),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_answering(self.url)
        self.client = NodeClient(self.url)

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def node_command(home: Path):
    """make(port, *extra) -> the command line of a fake node for this test's home."""
    return lambda port, *extra: fake_node_command(port, home, *extra)


@pytest.fixture
def port() -> int:
    """A free local port."""
    return free_port()


@pytest.fixture
def fake_node(home: Path):
    """A fake node process (tests/app/fake_node.py) that someone else started."""
    node = FakeNode(home)
    yield node
    node.close()


@pytest.fixture(params=["fake", "real"])
def chat_node(request, home: Path):
    """Each chat test runs against the fake node and against the real tiny-model node
    (tests/conftest.py's `tiny_node`), skipped while that fixture doesn't exist."""
    if request.param == "fake":
        node = FakeNode(home)
        yield node
        node.close()
        return
    try:
        node = request.getfixturevalue("tiny_node")
    except pytest.FixtureLookupError:
        pytest.skip("needs the tiny_node fixture from tests/conftest.py")
    yield node
