"""A dialog with the end of a local log file (the node's, a worker's), one click from the
message that needs it, and a button to open its folder."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices, QFontDatabase
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

TAIL_LINES = 300


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(f.tell() - 256 * 1024, 0))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return f"(can't read {path}: {e.strerror or e})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def log_files(folder: Path) -> list[Path]:
    """The log files in a folder, most recently written first."""
    try:
        files = [p for p in folder.iterdir() if p.is_file() and p.suffix == ".log"]
    except OSError:
        return []
    return sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)


class LogDialog(QDialog):
    """Shows `path` (any log of its folder can be picked)."""

    def __init__(self, path: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Shoal log")
        self.resize(860, 520)
        self.folder = path.parent
        self.picker = QComboBox()
        files = log_files(self.folder)
        if path not in files:
            files.insert(0, path)
        for f in files:
            self.picker.addItem(f.name, str(f))
        self.picker.setCurrentIndex(files.index(path))
        self.picker.currentIndexChanged.connect(lambda _i: self.show_file())
        self.where = QLabel()
        self.where.setWordWrap(True)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        open_folder = QPushButton("Open folder")
        open_folder.clicked.connect(
            lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.folder))))
        close = QPushButton("Close")
        close.clicked.connect(self.accept)
        top = QHBoxLayout()
        top.addWidget(QLabel("Log:"))
        top.addWidget(self.picker, 1)
        top.addWidget(open_folder)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.where)
        layout.addWidget(self.text, 1)
        layout.addWidget(close)
        self.show_file()

    @property
    def path(self) -> Path:
        return Path(self.picker.currentData())

    def show_file(self) -> None:
        self.where.setText(f"The end of {self.path}")
        self.text.setPlainText(tail(self.path))
        bar = self.text.verticalScrollBar()
        bar.setValue(bar.maximum())
