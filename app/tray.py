"""The tray / menubar icon: its colour shows what the node is doing; menu Show window, Quit.

Icons are drawn with QPainter so there is nothing to ship or find at run time.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QPointF, Qt, Signal
from PySide6.QtGui import QAction, QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

# Grey for anything without a colour of its own (stopped, starting, unreachable).
COLOURS = {
    "idle": "#2e9d57",
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

    def __init__(self, parent: QObject | None = None, available: bool | None = None):
        super().__init__(parent)
        real = QSystemTrayIcon.isSystemTrayAvailable()
        # `available` overrides what the app's close policy assumes (tests); the icon is
        # only shown where a tray really exists.
        self.available = real if available is None else available
        self.state: str | None = None
        self.icons = {s: draw_icon(s) for s in (*COLOURS, None)}
        self.menu = QMenu()
        self.show_action = QAction("Show window", self.menu)
        self.quit_action = QAction("Quit Shoal", self.menu)
        self.show_action.triggered.connect(self.show_requested)
        self.quit_action.triggered.connect(self.quit_requested)
        self.menu.addAction(self.show_action)
        self.menu.addSeparator()
        self.menu.addAction(self.quit_action)
        self.icon = QSystemTrayIcon(self.icons[None], self)
        self.icon.setContextMenu(self.menu)
        self.icon.setToolTip("Shoal")
        self.icon.activated.connect(self._activated)
        if self.available and real:
            self.icon.show()

    def set_status(self, status: dict[str, Any]) -> None:
        """Follow the node's status (connect to StatusMonitor.changed)."""
        state = status.get("state")
        self.state = state
        self.icon.setIcon(self.icons.get(state if state in COLOURS else None))
        tip = f"Shoal — {state or 'unknown'}"
        if status.get("model"):
            tip += f" · {status['model']}"
        self.icon.setToolTip(tip)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        # A left click shows the window; the context menu handles the rest.
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.show_requested.emit()

    def hide(self) -> None:
        self.icon.hide()
