"""Shoal's GUI process: find or start the local node, show the window and the tray icon,
and on quit stop the node we started so nothing is left running."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, QTimer
from PySide6.QtWidgets import QApplication, QVBoxLayout, QWidget

from app.chat import ChatPane
from app.cluster_state import ClusterState
from app.common import message_of
from app.conversations import ConversationStore
from app.developer import DeveloperPanel
from app.keeper import NodeKeeper, Restarts
from app.metrics import Metrics
from app.models_view import ModelsView
from app.node import LocalNode, NodeStartError
from app.node_banner import NodeBanner
from app.polling import Poller
from app.settings import SettingsDialog, node_settings
from app.status import BUSY, StatusMonitor
from app.tasks import Tasks
from app.theme import APPEARANCE, Appearance
from app.tray import Tray
from app.window import MainWindow
from engine.net import DEFAULT_PORT
from engine.paths import default_home, ensure, logs_dir

log = logging.getLogger(__name__)


class ShoalApp(QObject):
    """Wires the pieces together and owns start-up and the one orderly shutdown."""

    def __init__(self, home: Path, port: int | None = None,
                 tray_available: bool | None = None,
                 node_command: list[str] | None = None, start_timeout: float = 60.0,
                 status_interval: float = 1.0, topology_interval: float | None = None,
                 hang_after: float = 5.0, crash_window: float = 60.0):
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
        # every request the node served, as its /metrics counts them: the charts' points
        self.finished = Poller(self.tasks, self.node.url, self.metrics.read_finished,
                               status_interval, api_key=api.api_key, parent=self)
        self.finished.updated.connect(self.metrics.add_finished)
        self.appearance = Appearance(QApplication.instance(),
                                     str(self.settings.value(APPEARANCE, "system")), self)
        self.tray = Tray(self, available=tray_available)
        self.tray.set_api_url(f"{self.node.url}/v1")
        self.window = MainWindow(self.monitor, self.settings, self.tray.available)
        self.chat: ChatPane | None = None
        self.models_view: ModelsView | None = None
        self.placement = None
        self.developer: DeveloperPanel | None = None
        self.settings_dialog: SettingsDialog | None = None
        self._shut_down = False
        self._starting = True  # the start page shows until the model is ready
        self._models_key: tuple = ()  # what the model lists were last read for
        # Keeping the node alive: what the banner and status bar say while it is down,
        # and the model to load again once it is back.
        self.keeper = NodeKeeper(self.node, self.tasks, Restarts(window=crash_window),
                                 hang_after, self)
        self.banner = NodeBanner(self.node.log_path)
        self._add_banner()
        self._node_note: dict | None = None
        self._wanted_model: str | None = None
        self._resume: str | None = None
        self._resume_tries = 0

        self.monitor.changed.connect(self.tray.set_status)
        self.monitor.changed.connect(self.state.set_status)
        self.monitor.changed.connect(self._follow_start)
        self.monitor.changed.connect(self._follow_node)
        self.keeper.restarting.connect(self._node_restarting)
        self.keeper.back.connect(self._node_back)
        self.keeper.gave_up.connect(self._node_given_up)
        self.keeper.lost.connect(self._node_lost)
        self.banner.retry_requested.connect(self.keeper.try_again)
        self.metrics.changed.connect(lambda: self.tray.set_watts(self.metrics.cluster_watts_now()))
        self.state.poller.updated.connect(lambda _t: self.metrics.add_cards(self.state.cards()))
        self.state.changed.connect(self._summarise)
        self.tray.show_requested.connect(self.window.show_and_raise)
        self.tray.quit_requested.connect(self.quit)
        self.tray.stop_requested.connect(self.stop_model)
        self.tray.settings_requested.connect(self.open_settings)
        self.window.quit_requested.connect(self.quit)
        self.window.settings_requested.connect(self.open_settings)
        self.window.appearance_requested.connect(self.set_appearance)
        self.window.new_chat_requested.connect(self.new_chat)
        self.window.model_picker_requested.connect(self.pick_model)
        self.window.stop_requested.connect(self._stop_reply)
        self.window.start_page.retry_requested.connect(self.start_node)
        self.window.start_page.skip_requested.connect(self._started)
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
        self._starting = True
        self.window.start_page.show_starting()
        self.window.show_start_page()
        self.monitor.set_local({"state": "starting"})
        self.tasks.run(self.node.start, on_done=self._node_ready, on_error=self._node_failed)

    def _node_ready(self, _node: LocalNode) -> None:
        if self._shut_down:
            return
        if self.chat is None:
            self._build_views()
        self.chat.refresh_models()
        self.placement.refresh_models()
        self.models_view.start()
        self.monitor.start()
        self.finished.start()
        self.state.start()
        self.keeper.watch()

    # --- keeping the node alive -----------------------------------------------------------
    def _add_banner(self) -> None:
        """The banner goes above the pages, so the view the user was in stays in view."""
        pages = self.window.takeCentralWidget()
        holder = QWidget()
        column = QVBoxLayout(holder)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.banner)
        column.addWidget(pages, 1)
        self.window.setCentralWidget(holder)

    def _note(self, status: dict) -> None:
        """What the status bar, tray and views show while the node can't speak."""
        self._node_note = status = {"error_detail": "", **status}  # a sentence already
        self.monitor.set_local(status)

    def _node_down(self, sentence: str, state: str, **banner: bool) -> None:
        """The node can't answer: the banner, the status bar and the chat say why (the
        reply being written ends now, with Try again)."""
        self.banner.say(sentence, **banner)
        if self.chat is not None:
            self.chat.node_lost(sentence)
        self._note({"state": state, "error": sentence})

    def _node_restarting(self, sentence: str) -> None:
        self._node_down(sentence, "starting", retry=False)
        if self._wanted_model:
            self._resume, self._resume_tries = self._wanted_model, 0

    def _node_back(self) -> None:
        log.info("The local node answers again")
        self.banner.hide()
        if self.settings_dialog is not None:
            self.settings_dialog.node_restarted()
        self._node_note = None
        # The poll says only what changed: read the status once, so what shows is now's.
        client = self.node.client  # the worker holds no Qt object (app/tasks.py)
        self.tasks.run(lambda: client.status().to_json(),
                       on_done=self._status_now, on_error=lambda _e: None)
        self._follow_address()
        self._refresh_models()
        for view in (self.state, self.models_view, self.developer):  # now, not next poll
            poller = getattr(view, "poller", None)
            if poller is not None:
                poller.poke()

    def _follow_address(self) -> None:
        """After Restart now with a new address, port or key: every poll and the
        addresses shown follow the node (the shared client already did)."""
        url, key = self.node.url, self.node.api_key
        self.monitor.retarget(url, key)
        self.finished.retarget(url, key)
        self.tray.set_api_url(f"{url}/v1")
        for view in (self.state, self.models_view):
            if view is not None:
                view.poller.retarget(url, key)
        if self.developer is not None:
            self.developer.retarget(url, key)

    def _status_now(self, status: dict) -> None:
        if self._node_note is None and not self._shut_down:
            self.monitor.set_local(status)

    def _node_given_up(self, sentence: str) -> None:
        self._node_down(sentence, "error", retry=True, error=True)

    def _node_lost(self, sentence: str) -> None:
        self._node_down(sentence, "unreachable", retry=True, log=False, error=True)

    def _follow_node(self, status: dict) -> None:
        """Keep the sentence about a node that is down in view (the status poll would
        replace it with a bare 'not answering'); notice someone else's node coming back;
        load the model it ran again once it is back."""
        state = status.get("state")
        note = self._node_note
        if note is not None and status is not note:
            if state == "unreachable":
                QTimer.singleShot(0, lambda: self._node_note is note
                                  and self.monitor.set_local(note))
            elif state not in ("starting", None) and not self.keeper.busy \
                    and note.get("state") == "unreachable":
                self._node_note = None  # the other program's node answers again
                self.banner.hide()
                self.keeper.watch()
            return
        if state in ("idle", "loading", "generating") and not self.keeper.busy:
            self._wanted_model = status.get("model")
        self._resume_model(status)

    def _resume_model(self, status: dict) -> None:
        """After a restart: the node loads its default model by itself; any other model
        the user had loaded is asked for again (twice at most, should the node's own
        start-up load race ours)."""
        wanted = self._resume
        if wanted is None or status.get("state") != "idle" or \
                (status.get("runner") or {}).get("type") in BUSY:
            return
        if status.get("model") == wanted or self._resume_tries >= 2:
            self._resume = None
            return
        self._resume_tries += 1
        log.info("Loading %s again after the node's restart", wanted)
        self.tasks.run(self.node.client.load, wanted,
                       on_error=lambda e: log.warning("Loading %s again failed: %s",
                                                      wanted, message_of(e)))

    def restart_node(self) -> None:
        """Settings → Restart now: the node we started, with what was saved; the window
        stays as it is."""
        if self.node.started_by_us:
            api = node_settings(self.settings)
            way_in = (api.host, api.port, api.api_key)
            moved = way_in != (self.node.host, self.node.port, self.node.api_key)
            self.keeper.restart_now("to apply the new settings", to=way_in if moved else None)

    def _follow_models(self, status: dict) -> None:
        """The chat's and placement's model lists follow what the node has: a first run's
        import, a model loaded or unloaded (a list read while the import ran is empty).
        Not while the node is down: a list read then fails, and stays said."""
        if status.get("state") in ("starting", "unreachable") or status is self._node_note:
            return
        key = (status.get("default_model"), status.get("model"),
               (status.get("runner") or {}).get("type"))
        if key != self._models_key:
            self._models_key = key
            self._refresh_models()

    def _refresh_models(self) -> None:
        if self.chat is not None:
            self.chat.refresh_models()
            self.placement.refresh_models()

    def _follow_start(self, status: dict) -> None:
        """The start page follows the node until its model is ready (or none loads)."""
        if self._starting and self.chat is not None and \
                self.window.start_page.follow(status):
            self._started()

    def _started(self) -> None:
        if self.chat is None:
            return
        self._starting = False
        self.window.show_view("Chat")
        self.chat.prompt.setFocus()

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
        self.state.watch_plan_view(self.placement)  # "planned" only for a plan seen
        self.chat.follow_cluster(self.state)
        self.charts = ChartsView(self.metrics)
        self.developer = DeveloperPanel(self.node.url, self.node.api_key, logs_dir(self.home),
                                        self.tasks)
        for title, view in (("Chat", self.chat), ("Models", self.models_view),
                            ("Topology", self.topology), ("Placement", self.placement),
                            ("Charts", self.charts), ("Developer", self.developer)):
            self.window.add_view(title, view)
        self.monitor.changed.connect(self.chat.set_node_status)
        self.monitor.changed.connect(self.metrics.add_status)
        self.monitor.changed.connect(self.developer.set_node_status)
        self.monitor.changed.connect(self.models_view.follow_status)
        self.monitor.changed.connect(self._follow_models)
        self.models_view.downloading_changed.connect(
            lambda on: None if on else self._refresh_models())
        self.chat.set_node_status(self.monitor.status)
        self.chat.reply_finished.connect(self.tray.set_speed)
        self.chat.reply_finished.connect(self.placement.set_measured)
        self.chat.reply_progress.connect(self.metrics.add_live)
        self.chat.reply_progress.connect(self.tray.set_live_speed)
        self.chat.reply_ended.connect(self.metrics.end_live)
        self.chat.reply_ended.connect(self.tray.end_live)
        self.chat.request_done.connect(self.developer.add_request)
        self.topology.add_machine_requested.connect(lambda: self.open_settings("Cluster"))
        self.models_view.downloading_changed.connect(self.tray.set_downloading)
        self.models_view.download_progress.connect(self.tray.set_download)
        self.models_view.chat_requested.connect(self.chat_with)
        self.models_view.plan_requested.connect(self.plan_for)
        self.placement.launch.launched.connect(lambda _i: self.chat.refresh_models())
        self.placement.prediction_changed.connect(lambda: self.charts.set_predicted_energy(
            (self.placement.prediction or {}).get("decode_j_per_token")))

    def chat_with(self, model: str) -> None:
        """Models view → Chat: load the model here unless it already runs."""
        self.chat.model_picker.setCurrentText(model)
        if self.state.status.get("model") != model:
            self.chat.load_model(model)
        self.window.show_view("Chat")

    def new_chat(self) -> None:
        """Ctrl+N: a new conversation, ready to type in."""
        if self.chat is None:
            return
        self.window.show_view("Chat")
        self.chat.new_conversation()

    def pick_model(self) -> None:
        """Ctrl+L: the model picker."""
        if self.chat is None:
            return
        self.window.show_view("Chat")
        self.chat.focus_model_picker()

    def _stop_reply(self) -> None:
        if self.chat is not None:
            self.chat.stop()

    def set_appearance(self, mode: str) -> None:
        """Light, dark or the system's, at once (from the View menu or Settings)."""
        self.settings.setValue(APPEARANCE, mode)
        self.appearance.set_mode(mode)
        self.window.sync_appearance(mode)
        dialog = self.settings_dialog
        if dialog is not None:
            box = dialog.appearance_box
            box.blockSignals(True)
            box.setCurrentIndex(max(box.findData(mode), 0))
            box.blockSignals(False)

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

    def open_settings(self, tab: str | None = None) -> None:
        if self.settings_dialog is None:
            self.settings_dialog = SettingsDialog(
                self.home, self.settings, self.node.client, self.tasks, self.tray.available,
                self.state.status.get("models_dir"), self.window)
            self.settings_dialog.finished.connect(self._settings_closed)
            self.settings_dialog.appearance_changed.connect(self.set_appearance)
            self.settings_dialog.restart_requested.connect(self.restart_node)
            self.settings_dialog.set_restartable(self.node.started_by_us)
        if tab:
            self.settings_dialog.show_tab(tab)
        self.settings_dialog.show()
        self.settings_dialog.raise_()

    def _settings_closed(self, _result: int) -> None:
        self.window.sync_keep()
        self.settings_dialog.deleteLater()
        self.settings_dialog = None

    def _node_failed(self, error: BaseException) -> None:
        if self._shut_down:
            return
        # the app's own start-up sentence, else the node's error in a person's words
        reason = error.message if isinstance(error, NodeStartError) else message_of(error)
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
        self.keeper.close()
        self.monitor.stop()
        self.finished.stop()
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


def _x_server_answers(display: str) -> bool:
    """True when something listens on the X display `display` (":0", "localhost:10.0")."""
    host, _, rest = display.rpartition(":")
    try:
        number = int(rest.split(".")[0])
    except ValueError:
        return False
    if host in ("", "unix"):
        targets = [(f"\0/tmp/.X11-unix/X{number:d}", socket.AF_UNIX),  # Linux abstract socket
                   (f"/tmp/.X11-unix/X{number:d}", socket.AF_UNIX)]
    else:
        targets = [((host, 6000 + number), socket.AF_INET)]
    for address, family in targets:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                s.connect(address)
                return True
        except OSError:
            continue
    return False


def missing_display(env: dict[str, str] | None = None, platform: str = sys.platform
                    ) -> str | None:
    """What stops Qt from opening a window here, or None. Without a display Qt aborts with
    a message about its xcb plug-in; this says what is actually missing, before it can."""
    env = dict(os.environ if env is None else env)
    if not platform.startswith("linux"):
        return None
    wanted = [p.split(":")[0] for p in env.get("QT_QPA_PLATFORM", "").split(";") if p]
    if any(p not in ("xcb", "wayland") for p in wanted):
        return None  # offscreen, vnc, eglfs...: the user chose a platform that needs no display
    x, wayland = env.get("DISPLAY", ""), env.get("WAYLAND_DISPLAY", "")
    if "wayland" in (wanted or ["wayland"]) and wayland:
        runtime = env.get("XDG_RUNTIME_DIR", "")
        if Path(wayland).is_absolute() or not runtime or (Path(runtime) / wayland).exists():
            return None
    if "xcb" in (wanted or ["xcb"]) and x and _x_server_answers(x):
        return None
    if not x and not wayland:
        return "no display (DISPLAY and WAYLAND_DISPLAY are not set)"
    shown = ", ".join(f"{k}={v}" for k, v in (("DISPLAY", x), ("WAYLAND_DISPLAY", wayland)) if v)
    return f"no display answers ({shown})"


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
    problem = None if QApplication.instance() else missing_display()
    if problem:
        print(f"Shoal can't open its window: {problem}. Without a window, run the node "
              "alone with `shoal node` (headless; chat with `shoal chat` or the /v1 API).",
              file=sys.stderr)
        return 2
    home = Path(args.home) if args.home else default_home()
    _setup_logging(home, args.log_level)
    qt_app = QApplication.instance() or QApplication(argv[:1] or ["shoal"])
    qt_app.setApplicationName("Shoal")
    qt_app.setOrganizationName("Shoal")
    shoal = ShoalApp(home, args.port)
    shoal.window.setWindowIcon(shoal.tray.colour_icons["idle"])

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
