"""The tray / menubar icon: its colour shows what Shoal is doing (idle, downloading,
loading, generating, error); its menu sums up the cluster, the running model with its
live tokens/s and watts, and a download's progress, and opens the window, copies the API
address, stops the model or quits.

Icons are drawn with QPainter so there is nothing to ship or find at run time. On macOS
the menubar gets a template icon (black on transparency, marked as a mask), which the
system tints for a light or dark menubar; the state then shows in the menu instead.
"""

from __future__ import annotations

import sys
from typing import Any

from PySide6.QtCore import QObject, QPointF, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QColor, QGuiApplication, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.common import fmt_tps
from app.theme import GREY, STATES

COLOURS = STATES  # grey for anything without a colour of its own (stopped, starting, ...)
LIVE_FOR_MS = 3000  # a live speed not updated for this long is no longer "now"


def state_colour(state: str | None) -> QColor:
    return QColor(COLOURS.get(state or "", GREY))


def draw_icon(state: str | None, size: int = 64, template: bool = False) -> QIcon:
    """A filled circle in the state's colour with a small 'fish' notch, on transparency;
    `template`: black with the notch cut out, for macOS to tint (a busy state adds a ring
    gap so it still shows)."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor("black") if template else state_colour(state))
    r = size * 0.42
    painter.drawEllipse(QPointF(size / 2, size / 2), r, r)
    if template:
        painter.setCompositionMode(QPainter.CompositionMode.CompositionMode_Clear)
        if state in ("loading", "generating", "downloading"):
            painter.drawEllipse(QPointF(size / 2, size / 2), r * 0.55, r * 0.55)
    else:
        painter.setBrush(QColor("white"))
    painter.drawEllipse(QPointF(size * 0.62, size * 0.42), size * 0.07, size * 0.07)
    painter.end()
    icon = QIcon(pixmap)
    icon.setIsMask(template)
    return icon


class Tray(QObject):
    """Owns the QSystemTrayIcon when the desktop has a tray; harmless without one."""

    show_requested = Signal()
    quit_requested = Signal()
    stop_requested = Signal()
    settings_requested = Signal()

    def __init__(self, parent: QObject | None = None, available: bool | None = None,
                 template: bool | None = None):
        super().__init__(parent)
        real = QSystemTrayIcon.isSystemTrayAvailable()
        # `available` overrides what the app's close policy assumes (tests); the icon is
        # only shown where a tray really exists.
        self.available = real if available is None else available
        self.state: str | None = None
        self.status: dict[str, Any] = {}
        self.downloading = False
        self.speed: float | None = None  # decode tokens/s: live while a reply streams
        self.live = False
        self.last_speed: float | None = None  # the last finished reply's, for after a live one
        self._live_timer = QTimer(self, singleShot=True, interval=LIVE_FOR_MS)
        self._live_timer.timeout.connect(self.end_live)
        self.watts: float | None = None  # the cluster's, when any node measures it
        self.download: str | None = None  # e.g. "Downloading Qwen3-4B-4bit: 42%"
        self.api_url: str | None = None
        self.template = sys.platform == "darwin" if template is None else template
        self.colour_icons = {s: draw_icon(s) for s in (*COLOURS, None)}
        self.icons = ({s: draw_icon(s, template=True) for s in (*COLOURS, None)}
                      if self.template else self.colour_icons)
        self.menu = QMenu()
        self.cluster_action = QAction("Cluster: starting…", self.menu)
        self.model_action = QAction("No model running", self.menu)
        self.download_action = QAction("", self.menu)
        self.download_action.setVisible(False)
        for a in (self.cluster_action, self.model_action, self.download_action):
            a.setEnabled(False)  # information, not commands
        self.show_action = QAction("Open Shoal", self.menu)
        self.copy_url_action = QAction("Copy API URL", self.menu)
        self.copy_url_action.setEnabled(False)
        self.copy_url_action.triggered.connect(self.copy_api_url)
        self.stop_action = QAction("Stop model", self.menu)
        self.stop_action.setEnabled(False)
        self.settings_action = QAction("Settings…", self.menu)
        self.quit_action = QAction("Quit Shoal", self.menu)
        self.show_action.triggered.connect(self.show_requested)
        self.stop_action.triggered.connect(self.stop_requested)
        self.settings_action.triggered.connect(self.settings_requested)
        self.quit_action.triggered.connect(self.quit_requested)
        for a in (self.cluster_action, self.model_action, self.download_action, None,
                  self.show_action, self.copy_url_action, self.stop_action,
                  self.settings_action, None, self.quit_action):
            if a is None:
                self.menu.addSeparator()
            else:
                self.menu.addAction(a)
        self.icon = QSystemTrayIcon(self.icons[None], self)
        self.icon.setContextMenu(self.menu)
        self.icon.setToolTip("Shoal")
        self.icon.activated.connect(self._activated)
        if self.available and real:
            self.icon.show()

    def set_status(self, status: dict[str, Any]) -> None:
        """Follow the node's status (connect to StatusMonitor.changed)."""
        if status.get("model") != self.status.get("model"):
            self.speed = self.last_speed = None  # another model's figure, or none runs
            self.live = False
        elif self.live and status.get("state") not in ("generating", None):
            self._live_timer.start()  # the node is done: "now" ends unless tokens come
        self.status = status
        self._show()

    def set_downloading(self, on: bool) -> None:
        self.downloading = on
        self._show()

    def set_speed(self, stats: dict[str, Any]) -> None:
        """The last reply's figures (ChatPane.reply_finished)."""
        self.speed = self.last_speed = stats.get("generation_tps")
        self.live = False
        self._live_timer.stop()
        self._show()

    def set_live_speed(self, tokens: int, seconds: float) -> None:
        """A reply streaming now (ChatPane.reply_progress): its tokens/s so far. Without
        a new figure for LIVE_FOR_MS it is no longer shown as "now"."""
        if seconds > 0.2 and tokens > 1:
            self.speed, self.live = (tokens - 1) / seconds, True
            self._live_timer.start()
            self._show()

    def end_live(self) -> None:
        """Nothing streams now (a reply stopped, failed or went quiet): the live figure
        goes; the last finished reply's speed stays."""
        self._live_timer.stop()
        if self.live:
            self.speed, self.live = self.last_speed, False
            self._show()

    def set_watts(self, watts: float | None) -> None:
        self.watts = watts
        self._show()

    def set_download(self, text: str | None) -> None:
        """A running download's progress line (None: none runs)."""
        self.download = text
        self.download_action.setText(text or "")
        self.download_action.setVisible(bool(text))

    def set_api_url(self, url: str | None) -> None:
        self.api_url = url
        self.copy_url_action.setEnabled(bool(url))

    def copy_api_url(self) -> None:
        if self.api_url:
            QGuiApplication.clipboard().setText(self.api_url)

    def set_cluster(self, nodes: int, reachable: int) -> None:
        self.cluster_action.setText(
            f"Cluster: {nodes} machine{'s' if nodes != 1 else ''}"
            + (f" ({reachable} reachable)" if reachable != nodes else ""))

    def _show(self) -> None:
        node_state = self.status.get("state")
        # A download shows unless the node has something more urgent to say.
        state = "downloading" if self.downloading and node_state in (None, "idle", "stopped") \
            else node_state
        self.state = state
        self.icon.setIcon(self.icons.get(state if state in COLOURS else None))
        model = self.status.get("model")
        running = bool(model) and (self.status.get("runner") or {}).get("type") in (
            "Ready", "Loading")
        runner = self.status.get("runner") or {}
        gone = runner.get("unloaded") if runner.get("type") == "Idle" else None
        text = f"Model: {model}" if model else \
            f"{gone} unloaded (unused); the next request loads it" if gone else \
            "No model running"
        if model and self.speed:
            text += f" · {fmt_tps(self.speed)} tokens/s" + (" now" if self.live else "")
        if self.watts is not None:
            text += f" · {self.watts:.0f} W"
        if model and node_state == "loading":
            text += " · loading"
        self.model_action.setText(text)
        self.stop_action.setEnabled(running)
        tip = f"Shoal — {state or 'unknown'}"
        if model:
            tip += f" · {model}"
        if self.download:
            tip += f"\n{self.download}"
        self.icon.setToolTip(tip)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        # A left click shows the window; the context menu handles the rest.
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.show_requested.emit()

    def hide(self) -> None:
        self.icon.hide()
