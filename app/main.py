"""Shoal's GUI process: find or start the local node, show the window and the tray icon,
and on quit stop the node we started so nothing is left running."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, QTimer
from PySide6.QtWidgets import QApplication

from app.chat import ChatPane
from app.conversations import ConversationStore
from app.node import LocalNode, NodeStartError
from app.status import StatusMonitor
from app.tasks import Tasks
from app.tray import Tray
from app.window import MainWindow
from engine.cli import DEFAULT_PORT
from engine.errors import ShoalError
from engine.paths import default_home, ensure, logs_dir

log = logging.getLogger(__name__)


class ShoalApp(QObject):
    """Wires the pieces together and owns start-up and the one orderly shutdown."""

    def __init__(self, home: Path, port: int = DEFAULT_PORT, tray_available: bool | None = None,
                 node_command: list[str] | None = None, start_timeout: float = 60.0,
                 status_interval: float = 1.0):
        super().__init__()
        self.home = ensure(Path(home))
        self.tasks = Tasks(self)
        self.settings = QSettings(str(self.home / "app.ini"), QSettings.Format.IniFormat)
        self.node = LocalNode(self.home, port, command=node_command, start_timeout=start_timeout)
        self.store = ConversationStore(self.home)
        self.monitor = StatusMonitor(self.tasks, self.node.url, interval=status_interval)
        self.tray = Tray(self, available=tray_available)
        self.window = MainWindow(self.monitor, self.settings, self.tray.available)
        self.chat: ChatPane | None = None
        self._shut_down = False

        self.monitor.changed.connect(self.tray.set_status)
        self.tray.show_requested.connect(self.window.show_and_raise)
        self.tray.quit_requested.connect(self.quit)
        self.window.quit_requested.connect(self.quit)
        self.window.start_page.retry_requested.connect(self.start_node)
        app = QApplication.instance()
        app.setQuitOnLastWindowClosed(False)  # MainWindow.closeEvent decides
        app.aboutToQuit.connect(self.shutdown)

    def start(self) -> None:
        self.window.show()
        self.start_node()

    def start_node(self) -> None:
        self.window.start_page.show_starting()
        self.window.show_start_page()
        self.monitor.set_local({"state": "starting"})
        self.tasks.run(self.node.start, on_done=self._node_ready, on_error=self._node_failed)

    def _node_ready(self, _node: LocalNode) -> None:
        if self._shut_down:
            return
        if self.chat is None:
            self.chat = ChatPane(self.node.client, self.store, self.tasks)
            self.monitor.changed.connect(self.chat.set_node_status)
            self.window.show_chat(self.chat)
        else:
            self.window.show_chat(self.chat)
        self.chat.refresh_models()
        self.monitor.start()

    def _node_failed(self, error: BaseException) -> None:
        if self._shut_down:
            return
        reason = error.message if isinstance(error, ShoalError) else repr(error)
        tail = error.log_tail if isinstance(error, NodeStartError) else self.node.log_tail()
        log.error("The local node didn't start: %s", reason)
        self.window.start_page.show_failure(reason, tail, str(self.node.log_path))
        self.monitor.set_local({"state": "error", "error": reason})

    def quit(self) -> None:
        """Menu Quit, tray Quit, Cmd/Ctrl+Q and closing the window all end here."""
        self.window.hide()
        self.shutdown()
        QApplication.instance().quit()

    def shutdown(self) -> None:
        """Stop polling and streams, stop the node if we started it, wait for workers;
        every step bounded. Safe to call twice."""
        if self._shut_down:
            return
        self._shut_down = True
        self.monitor.stop()
        self.tasks.cancel_streams()
        self.tray.hide()
        self.node.stop()
        if not self.tasks.wait(5000):
            log.warning("Background work still running at quit; not waiting longer.")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shoal-app", description="Shoal desktop app")
    p.add_argument("--home", type=Path, default=None, help="state folder (default: per user)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="local node port")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("-v", "--verbose", action="store_true", help="same as --log-level DEBUG")
    args = p.parse_args(argv)
    if args.verbose:
        args.log_level = "DEBUG"
    return args


def _setup_logging(home: Path, level: str) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    try:
        handlers.append(logging.FileHandler(ensure(logs_dir(home)) / "app.log"))
    except OSError:
        pass  # a read-only home still gets a window, just no log file
    logging.basicConfig(level=level.upper(), handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per status poll is noise


def main(argv: list[str] | None = None) -> int:
    """Run the app until the user quits; returns the exit code. argv is a full command
    line like sys.argv (program name first): [prog, --home H, --port P, -v]."""
    argv = list(sys.argv if argv is None else argv)
    args = _parse(argv[1:])
    home = Path(args.home) if args.home else default_home()
    _setup_logging(home, args.log_level)
    qt_app = QApplication.instance() or QApplication(argv[:1] or ["shoal"])
    qt_app.setApplicationName("Shoal")
    qt_app.setOrganizationName("Shoal")
    shoal = ShoalApp(home, args.port)
    shoal.window.setWindowIcon(shoal.tray.icons["idle"])

    # Ctrl+C / SIGTERM take the same orderly path as Quit; the timer lets Python run
    # its signal handlers while Qt's event loop is in C++.
    previous = {sig: signal.signal(sig, lambda *_: shoal.quit())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    tick = QTimer(interval=300)
    tick.timeout.connect(lambda: None)
    tick.start()
    try:
        shoal.start()
        code = qt_app.exec()
    finally:
        tick.stop()
        shoal.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code
