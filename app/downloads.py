"""The downloads under the model list: one row per pull with its progress, speed and ETA,
Cancel while it runs and Retry once it failed or was cancelled; a download that failed
says so at once, with its reason in a banner over the list (not in a cut-off column)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

import engine.hub.errors  # noqa: F401 - its codes (hub_unreachable, ...) rebuild their errors
from app import theme
from app.common import fmt_bytes, fmt_eta, fmt_rate, message_of
from app.error_note import ErrorNote
from app.sentences import explain
from engine.errors import ShoalError
from engine.records import DownloadInfo, ErrorInfo

ACTION = 4  # the column of a row's button
STATE_TEXT = {"failed": "Failed", "cancelled": "Cancelled", "done": "Done"}
BUTTONS = {"running": "Cancel", "failed": "Retry", "cancelled": "Resume"}


def error_of(error: ErrorInfo) -> ShoalError:
    """The node's error body as the error it stands for (HubUnreachable, ...)."""
    return ShoalError.from_openai({"error": error.to_json()}, 0)


def reason(error: ErrorInfo | None) -> str:
    """Why a download stopped, in the words the app uses for every error."""
    return "the node didn't say why" if error is None else message_of(error_of(error))


def name_of(repo: str) -> str:
    return repo.split("/")[-1]


class DownloadsPanel(QWidget):
    """cancel_requested(download id), retry_requested(repo): the user's clicks."""

    cancel_requested = Signal(str)
    retry_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.downloads: list[DownloadInfo] = []
        self.failed: DownloadInfo | None = None  # the one the banner is about
        self.label = QLabel("Downloads")
        theme.set_role(self.label, "section")
        self.note = ErrorNote(role="warning")  # the reason, its technical text a click away
        self.banner_text = self.note.text
        self.banner_text.setObjectName("downloadProblem")
        self.retry_button = QPushButton("Retry")
        self.retry_button.clicked.connect(self._retry_failed)
        self.banner = QWidget()
        row = QHBoxLayout(self.banner)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.note, 1)
        row.addWidget(self.retry_button, 0, Qt.AlignmentFlag.AlignTop)
        self.table = QTableWidget(0, 5)
        self.table.setAccessibleName("Downloads")
        self.table.setHorizontalHeaderLabels(["Download", "Progress", "Speed", "ETA", ""])
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setMaximumHeight(130)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label)
        layout.addWidget(self.banner)
        layout.addWidget(self.table)
        self.banner.hide()
        self.hide()

    def set_downloads(self, downloads: list[DownloadInfo]) -> None:
        """The node's list, newest first."""
        self.downloads = sorted(downloads, key=lambda d: -float(d.started))
        self.setVisible(bool(self.downloads))
        self._banner()
        t = self.table
        t.setRowCount(len(self.downloads))
        for i, d in enumerate(self.downloads):
            self._row(i, d)

    def _banner(self) -> None:
        """The newest pull of each model that failed, the latest of them in words."""
        newest: dict[str, DownloadInfo] = {}
        for d in self.downloads:
            newest.setdefault(d.repo, d)
        failed = [d for d in newest.values() if d.state == "failed"]
        self.failed = failed[0] if failed else None
        self.banner.setVisible(bool(failed))
        if failed:
            more = f" ({len(failed) - 1} more failed: see below)" if len(failed) > 1 else ""
            d = failed[0]
            if d.error is None:
                self.note.set_text(f"Couldn't download {name_of(d.repo)}: the node didn't "
                                   f"say why.{more}")
            else:
                explained = explain(error_of(d.error))
                self.note.set_text(f"Couldn't download {name_of(d.repo)}: "
                                   f"{explained.sentence}{more}", explained.detail)
            self.retry_button.setAccessibleName(f"Retry the download of {failed[0].repo}")

    def _row(self, i: int, d: DownloadInfo) -> None:
        t = self.table
        p = d.progress
        done, total = (p.done, p.total) if p else (0, 0)
        state = str(d.state)
        bar = t.cellWidget(i, 1)
        if not isinstance(bar, QProgressBar):
            bar = QProgressBar()
            bar.setRange(0, 1000)
            # room for the longest text it shows, or it wraps and clips
            bar.setMinimumWidth(bar.fontMetrics().horizontalAdvance(
                "Cancelled at 999.9 MB / 999.9 GB") + 24)
            t.setCellWidget(i, 1, bar)
        bar.setValue(int(1000 * done / total) if total else 0)
        sizes = f"{fmt_bytes(done)} / {fmt_bytes(total)}" if total else ""
        bar.setFormat(STATE_TEXT[state] + (f" at {sizes}" if sizes and state != "done" else "")
                      if state in STATE_TEXT else sizes or "Starting…")
        bar.setAccessibleName(f"{d.repo}: {bar.format()}")
        name = QTableWidgetItem(d.repo)
        if d.state == "failed":
            name.setToolTip(reason(d.error))
        t.setItem(i, 0, name)
        running = d.state == "running"
        t.setItem(i, 2, QTableWidgetItem(fmt_rate(p.speed_Bps if p and running else None)))
        t.setItem(i, 3, QTableWidgetItem(fmt_eta(p.eta_s if p and running else None)))
        text = BUTTONS.get(state)
        button = t.cellWidget(i, ACTION)
        if text is None:
            t.removeCellWidget(i, ACTION)
        elif not isinstance(button, QPushButton) or button.property("download") != d.id \
                or button.text() != text:
            button = QPushButton(text)
            button.setProperty("download", d.id)
            verb = "Cancel" if running else "Retry" if state == "failed" else "Resume"
            button.setAccessibleName(f"{verb} the download of {d.repo}")
            button.clicked.connect(lambda _c=False, x=d: self._clicked(x))
            t.setCellWidget(i, ACTION, button)

    def _retry_failed(self) -> None:
        if self.failed is not None:
            self.retry_requested.emit(self.failed.repo)

    def _clicked(self, d: DownloadInfo) -> None:
        if d.state == "running":
            self.cancel_requested.emit(d.id)
        else:
            self.retry_requested.emit(d.repo)

    def action(self, row: int) -> QPushButton | None:
        """A row's button (Cancel, Retry or Resume), if it has one."""
        button = self.table.cellWidget(row, ACTION)
        return button if isinstance(button, QPushButton) else None

    def status(self, row: int) -> str:
        """A row's status as its progress bar shows it."""
        bar = self.table.cellWidget(row, 1)
        return bar.format() if isinstance(bar, QProgressBar) else ""
