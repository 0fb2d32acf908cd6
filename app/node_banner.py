"""The line above the views that says what happened to the app's node: it stopped and is
starting again, it stopped too often, or someone else's node went away, with its log one
click away and Try again where the next step is the user's."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app import theme


class NodeBanner(QFrame):
    """Hidden while the node is well."""

    retry_requested = Signal()

    def __init__(self, log_path: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.log_path = log_path
        self.setObjectName("nodeBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.log_button = QPushButton("Show log")
        self.log_button.setAccessibleName("Show the log of Shoal's engine")
        self.log_button.clicked.connect(self.show_log)
        self.retry_button = QPushButton("Try again")
        self.retry_button.clicked.connect(self.retry_requested)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.addWidget(self.text, 1)
        row.addWidget(self.log_button)
        row.addWidget(self.retry_button)
        self.log_dialog = None
        self.hide()

    def say(self, sentence: str, retry: bool, log: bool = True, error: bool = False) -> None:
        """Show `sentence`; Try again when the next step is the user's."""
        self.text.setText(sentence)
        theme.set_role(self.text, "error" if error else None)
        self.setAccessibleName(sentence)
        self.retry_button.setVisible(retry)
        self.log_button.setVisible(log)
        self.show()

    def show_log(self) -> None:
        from app.logs import LogDialog
        self.log_dialog = LogDialog(self.log_path, self)
        self.log_dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.log_dialog.show()
