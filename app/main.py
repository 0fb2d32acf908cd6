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
from app.cluster_state import ClusterState
from app.common import message_of
from app.conversations import ConversationStore
from app.metrics import Metrics
from app.models_view import ModelsView
from app.node import LocalNode, NodeStartError
from app.settings import SettingsDialog, node_settings
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

    def __init__(self, home: Path, port: int | None = None,
                 tray_available: bool | None = None,
                 node_command: list[str] | None = None, start_timeout: float = 60.0,
                 status_interval: float = 1.0, topology_interval: float | None = None):
        super().__init__()
        self.home = ensure(Path(home))
        self.tasks = Tasks(self, max_threads=16)  # pollers each hold a thread
        self.settings = QSettings(str(self.home / "app.ini"), QSettings.Format.IniFormat)
        api = node_settings(self.settings)  # what the user chose for the node we start
        self.node = LocalNode(self.home, port or api.port, host=api.host,
                              command=node_command, start_timeout=start_timeout,
                              api_key=api.api_key)
        self.store = ConversationStore(self.home)
        self.monitor = StatusMonitor(self.tasks, self.node.url, interval=status_interval,
                                     api_key=api.api_key)
        self.state = ClusterState(self.tasks, self.node.client, api_key=api.api_key,
                                  **({"interval": topology_interval}
                                     if topology_interval else {}))
        self.metrics = Metrics(parent=self)
        self.tray = Tray(self, available=tray_available)
        self.window = MainWindow(self.monitor, self.settings, self.tray.available)
        self.chat: ChatPane | None = None
        self.models_view: ModelsView | None = None
        self.placement = None
        self.settings_dialog: SettingsDialog | None = None
        self._shut_down = False

        self.monitor.changed.connect(self.tray.set_status)
        self.monitor.changed.connect(self.state.set_status)
        self.state.poller.updated.connect(lambda _t: self.metrics.add_cards(self.state.cards()))
        self.state.changed.connect(self._summarise)
        self.tray.show_requested.connect(self.window.show_and_raise)
        self.tray.quit_requested.connect(self.quit)
        self.tray.stop_requested.connect(self.stop_model)
        self.tray.settings_requested.connect(self.open_settings)
        self.window.quit_requested.connect(self.quit)
        self.window.settings_requested.connect(self.open_settings)
        self.window.start_page.retry_requested.connect(self.start_node)
        app = QApplication.instance()
        app.setQuitOnLastWindowClosed(False)  # MainWindow.closeEvent decides
        app.aboutToQuit.connect(self.shutdown)

    def start(self) -> None:
        from app.autostart import set_menubar_only
        from app.settings import MENUBAR_ONLY
        if self.tray.available and str(self.settings.value(MENUBAR_ONLY, False)).lower() \
                in ("true", "1"):
            set_menubar_only(True)  # macOS: the tray icon is the app; no-op elsewhere
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
            self._build_views()
        self.window.show_view("Chat")
        self.chat.refresh_models()
        self.placement.refresh_models()
        self.models_view.start()
        self.monitor.start()
        self.state.start()

    def _build_views(self) -> None:
        from app.charts import ChartsView  # pyqtgraph: imported once the node is up
        from app.placement import PlacementView
        from app.topology import TopologyView
        client = self.node.client
        self.chat = ChatPane(client, self.store, self.tasks)
        self.models_view = ModelsView(client, self.tasks, self.state,
                                      api_key=self.node.api_key)
        self.topology = TopologyView(self.state)
        self.placement = PlacementView(client, self.tasks, self.state, logs_dir(self.home))
        self.charts = ChartsView(self.metrics)
        for title, view in (("Chat", self.chat), ("Models", self.models_view),
                            ("Topology", self.topology), ("Placement", self.placement),
                            ("Charts", self.charts)):
            self.window.add_view(title, view)
        self.monitor.changed.connect(self.chat.set_node_status)
        self.chat.reply_finished.connect(self.metrics.add_request)
        self.chat.reply_finished.connect(self.tray.set_speed)
        self.chat.reply_progress.connect(self.metrics.add_live)
        self.models_view.downloading_changed.connect(self.tray.set_downloading)
        self.models_view.chat_requested.connect(self.chat_with)
        self.models_view.plan_requested.connect(self.plan_for)
        self.placement.launch.launched.connect(lambda _i: self.chat.refresh_models())

    def chat_with(self, model: str) -> None:
        """Models view → Chat: load the model here unless it already runs."""
        self.chat.model_picker.setCurrentText(model)
        if self.state.status.get("model") != model:
            self.chat.load_model(model)
        self.window.show_view("Chat")

    def plan_for(self, model: str) -> None:
        self.placement.choose_model(model)
        self.window.show_view("Placement")

    def _summarise(self) -> None:
        cards = self.state.cards()
        self.tray.set_cluster(len(cards), sum(c.kind != "offline" for c in cards))

    def stop_model(self) -> None:
        """Tray → Stop model: the instance this node owns, else the local model."""
        inst = self.state.own_instance()
        if inst is not None:
            work, args = self.node.client.stop_instance, (inst["id"],)
        else:
            work, args = self.node.client.unload, ()
        self.tasks.run(work, *args, on_done=lambda _r: self.state.refresh(),
                       on_error=lambda e: log.warning("Stopping the model failed: %s",
                                                      message_of(e)))

    def open_settings(self) -> None:
        if self.settings_dialog is None:
            self.settings_dialog = SettingsDialog(
                self.home, self.settings, self.node.client, self.tasks, self.tray.available,
                self.state.status.get("models_dir"), self.window)
            self.settings_dialog.finished.connect(self._settings_closed)
        self.settings_dialog.show()
        self.settings_dialog.raise_()

    def _settings_closed(self, _result: int) -> None:
        self.window.sync_keep()
        self.settings_dialog.deleteLater()
        self.settings_dialog = None

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
        self.state.stop()
        if self.models_view is not None:
            self.models_view.stop()
        self.tasks.cancel_streams()
        self.tray.hide()
        self.node.stop()
        if not self.tasks.wait(5000):
            log.warning("Background work still running at quit; not waiting longer.")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shoal-app", description="Shoal desktop app")
    p.add_argument("--home", type=Path, default=None, help="state folder (default: per user)")
    p.add_argument("--port", type=int, default=None,
                   help=f"local node port (default: the one in Settings, else {DEFAULT_PORT})")
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
