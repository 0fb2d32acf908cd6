"""The tray / menubar icon: its colour shows what Shoal is doing (idle, downloading,
loading, generating, error); its menu sums up the cluster and the running model, and
opens the window, stops the model or quits.

Icons are drawn with QPainter so there is nothing to ship or find at run time.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QPointF, Qt, Signal
from PySide6.QtGui import QAction, QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.common import fmt_tps

# Grey for anything without a colour of its own (stopped, starting, unreachable).
COLOURS = {
    "idle": "#2e9d57",
    "downloading": "#8e5bd0",
    "loading": "#e0a020",
    "generating": "#2f7fd8",
    "error": "#d03b3b",
    "unreachable": "#d03b3b",
}
GREY = "#8a8a8a"


def state_colour(state: str | None) -> QColor:
    return QColor(COLOURS.get(state or "", GREY))


def draw_icon(state: str | None, size: int = 64) -> QIcon:
    """A filled circle in the state's colour with a small 'fish' notch, on transparency."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(state_colour(state))
    r = size * 0.42
    painter.drawEllipse(QPointF(size / 2, size / 2), r, r)
    painter.setBrush(QColor("white"))
    painter.drawEllipse(QPointF(size * 0.62, size * 0.42), size * 0.07, size * 0.07)
    painter.end()
    return QIcon(pixmap)


class Tray(QObject):
    """Owns the QSystemTrayIcon when the desktop has a tray; harmless without one."""

    show_requested = Signal()
    quit_requested = Signal()
    stop_requested = Signal()
    settings_requested = Signal()

    def __init__(self, parent: QObject | None = None, available: bool | None = None):
        super().__init__(parent)
        real = QSystemTrayIcon.isSystemTrayAvailable()
        # `available` overrides what the app's close policy assumes (tests); the icon is
        # only shown where a tray really exists.
        self.available = real if available is None else available
        self.state: str | None = None
        self.status: dict[str, Any] = {}
        self.downloading = False
        self.speed: float | None = None  # decode tokens/s of the last reply
        self.icons = {s: draw_icon(s) for s in (*COLOURS, None)}
        self.menu = QMenu()
        self.cluster_action = QAction("Cluster: starting…", self.menu)
        self.model_action = QAction("No model running", self.menu)
        for a in (self.cluster_action, self.model_action):
            a.setEnabled(False)  # information, not commands
        self.show_action = QAction("Open Shoal", self.menu)
        self.stop_action = QAction("Stop model", self.menu)
        self.stop_action.setEnabled(False)
        self.settings_action = QAction("Settings…", self.menu)
        self.quit_action = QAction("Quit Shoal", self.menu)
        self.show_action.triggered.connect(self.show_requested)
        self.stop_action.triggered.connect(self.stop_requested)
        self.settings_action.triggered.connect(self.settings_requested)
        self.quit_action.triggered.connect(self.quit_requested)
        for a in (self.cluster_action, self.model_action, None, self.show_action,
                  self.stop_action, self.settings_action, None, self.quit_action):
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
        self.status = status
        self._show()

    def set_downloading(self, on: bool) -> None:
        self.downloading = on
        self._show()

    def set_speed(self, stats: dict[str, Any]) -> None:
        """The last reply's figures (ChatPane.reply_finished)."""
        self.speed = stats.get("generation_tps")
        self._show()

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
        text = f"Model: {model}" if model else "No model running"
        if model and self.speed:
            text += f" · {fmt_tps(self.speed)} tokens/s"
        if model and node_state == "loading":
            text += " · loading"
        self.model_action.setText(text)
        self.stop_action.setEnabled(running)
        tip = f"Shoal — {state or 'unknown'}"
        if model:
            tip += f" · {model}"
        self.icon.setToolTip(tip)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        # A left click shows the window; the context menu handles the rest.
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.show_requested.emit()

    def hide(self) -> None:
        self.icon.hide()
