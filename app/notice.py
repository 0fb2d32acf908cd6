"""A one-line bar with one action, e.g. "Conversation deleted. [Undo]" for ten seconds, or
"Queued: sent when this reply ends. [Cancel]" until it is."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app import theme


class NoticeBar(QFrame):
    """Hidden until show_notice(); the action runs at most once, then the bar goes."""

    def __init__(self, name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName(name)
        theme.set_role(self, "bubble-assistant")  # a framed line, like a reply
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.button = QPushButton()
        self.button.clicked.connect(self._act)
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 2, 4, 2)
        row.addWidget(self.label, 1)
        row.addWidget(self.button)
        self._action: Callable[[], None] | None = None
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.dismiss)
        self.hide()

    def show_notice(self, text: str, action: str = "", on_action: Callable[[], None] | None
                    = None, timeout_ms: int | None = None) -> None:
        """Say `text`, with a button `action` that calls `on_action` (none when empty);
        gone after `timeout_ms` (never by itself when None)."""
        self.label.setText(text)
        self.setAccessibleName(text)
        self.button.setText(action)
        self.button.setAccessibleName(f"{action}: {text}" if action else "")
        self.button.setVisible(bool(action))
        self._action = on_action
        self._timer.stop()
        if timeout_ms:
            self._timer.start(timeout_ms)
        self.show()

    def remaining_ms(self) -> int:
        """How long the bar stays (-1: until dismissed)."""
        return self._timer.remainingTime() if self._timer.isActive() else -1

    def dismiss(self) -> None:
        self._timer.stop()
        self._action = None
        self.hide()

    def _act(self) -> None:
        action = self._action
        self.dismiss()
        if action is not None:
            action()
