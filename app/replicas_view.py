"""The copies of each model that runs as several (replicas): one row per copy with its
machines, how it runs, how busy it is and its share of the requests. Read from the node's
GET /shoal/replicas every ~2 s off the GUI thread (app/tasks.py); hidden while no model
runs as more than one copy. When the node stops answering, the rows go (never a stale
load left on screen) and a line says so until it answers again. Each row's Stop stops
that copy alone, wherever it runs (the node passes it on); the others serve on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QObject, QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import (
    QGridLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.catalog import spread
from app.common import message_of, route_missing
from app.tasks import Tasks
from engine.client import NodeClient
from engine.records import ReplicaInfo, ReplicasInfo
from engine.words import joined

log = logging.getLogger(__name__)
REFRESH_S = 2.0
OLD_NODE_S = 30.0  # a node without the route (an older Shoal): asked again rarely
TITLE = "Models running as several copies"
UNREACHABLE = ("Can't reach Shoal on this machine to see how busy the copies are; "
               "trying again every few seconds.")


@dataclass(frozen=True)
class CopyRow:
    """One copy as a row reads it (Qt-free)."""
    key: str  # the node that answers for it: stable across refreshes
    node: str  # the id of the node that answers for it (what Stop names)
    machines: str  # "studio", "studio and mini"
    how: str  # "on 1 machine", "on 2 machines, split by layers"
    running: int
    waiting: int
    streams: int
    share: float  # 0..1 of the requests this node sent to the model
    routed: int
    here: bool


def copy_rows(info: ReplicasInfo, name_of: Callable[[str], str]
              ) -> list[tuple[str, list[CopyRow]]]:
    """The models with more than one copy, each with its copies (in a steady order: this
    machine's first, then by name)."""
    by_model: dict[str, list[ReplicaInfo]] = {}
    for r in info.replicas:
        by_model.setdefault(r.model, []).append(r)
    out = []
    for model in sorted(by_model):
        found = by_model[model]
        if len(found) < 2:
            continue
        rows = [_row(r, name_of) for r in found]
        rows.sort(key=lambda c: (not c.here, c.machines))
        out.append((model, rows))
    return out


def _row(r: ReplicaInfo, name_of: Callable[[str], str]) -> CopyRow:
    ids = r.nodes or [r.node]
    names = [r.name if nid == r.node and r.name else name_of(nid) for nid in ids]
    return CopyRow(key=r.instance or r.node, node=r.node, machines=joined(names),
                   how=spread(r.strategy, len(ids)), running=int(r.running),
                   waiting=int(r.waiting), streams=max(1, int(r.streams)),
                   share=float(r.share), routed=int(r.routed), here=r.here)


def load_text(c: CopyRow) -> str:
    if not c.running and not c.waiting:
        return f"idle, room for {c.streams} at once"
    text = f"{c.running} of {c.streams} answering"
    return text + (f", {c.waiting} waiting" if c.waiting else "")


def share_text(c: CopyRow, total_routed: int) -> str:
    return "no requests yet" if not total_routed else f"{c.share * 100:.0f}% of requests"


class LoadBar(QWidget):
    """How full a copy is: requests answering (of the ones it runs at once), then the
    ones waiting for a turn, in the warning colour."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.running, self.waiting, self.streams = 0, 0, 1
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMaximumWidth(280)  # a gauge, not a rule across the window

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(160, 12)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(60, 12)

    def set_load(self, running: int, waiting: int, streams: int) -> None:
        self.running, self.waiting, self.streams = running, waiting, max(1, streams)
        self.update()

    def paintEvent(self, _event: QPaintEvent) -> None:  # noqa: N802 - Qt's name
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        track = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.setPen(theme.muted())
        p.setBrush(theme.colour("track"))
        p.drawRoundedRect(track, 3, 3)
        whole = max(self.streams, self.running + self.waiting)
        x = track.left()
        p.setPen(Qt.PenStyle.NoPen)
        for count, colour in ((self.running, theme.series(0)),
                              (self.waiting, theme.colour("warning"))):
            width = track.width() * count / whole
            if width > 0:
                p.setBrush(colour)
                p.drawRoundedRect(QRectF(x, track.top(), width, track.height()), 3, 3)
            x += width
        p.end()


class _CopyWidgets:
    """The widgets of one row, kept while the copy stays, so a refresh only changes text."""

    def __init__(self) -> None:
        self.machines = QLabel()
        self.machines.setIndent(16)  # under its model's line
        self.how = QLabel()
        theme.set_role(self.how, "muted")
        self.bar = LoadBar()
        self.load = QLabel()
        self.share = QLabel()
        self.stop = QPushButton("Stop")
        self.stop.setToolTip("Stop this copy only: the other copies keep answering.")

    def widgets(self) -> tuple[QWidget, ...]:
        return (self.machines, self.how, self.bar, self.load, self.share, self.stop)

    def show_row(self, c: CopyRow, total_routed: int) -> None:
        self.machines.setText(c.machines + (" (this machine)" if c.here else ""))
        self.how.setText(c.how)
        self.bar.set_load(c.running, c.waiting, c.streams)
        self.load.setText(load_text(c))
        self.share.setText(share_text(c, total_routed))
        self.share.setToolTip(f"This machine sent it {c.routed} of the {total_routed} "
                              "requests for this model it passed on since it started.")


class ReplicasView(QWidget):
    """`groups` holds what is shown: [(model, [CopyRow, ...])]; `error` why nothing is."""

    def __init__(self, client: NodeClient, tasks: Tasks,
                 name_of: Callable[[str], str] | None = None, interval: float = REFRESH_S,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.tasks = client, tasks
        self.name_of = name_of or (lambda nid: nid)
        self.interval = interval
        self.groups: list[tuple[str, list[CopyRow]]] = []
        self.error: str | None = None
        self._asking = False
        self._rows: dict[tuple[str, str], _CopyWidgets] = {}
        self._headers: list[QLabel] = []
        self.title = QLabel(TITLE)
        theme.set_role(self.title, "section")
        self.title.setIndent(0)  # in line with the model lines (a styled label indents)
        self.error_label = QLabel()
        self.error_label.setObjectName("replicasError")
        self.error_label.setWordWrap(True)
        theme.set_role(self.error_label, "error")
        self.error_label.hide()
        self.grid = QGridLayout()
        self.grid.setHorizontalSpacing(12)
        self.grid.setColumnStretch(6, 1)
        # what the last Stop did where it failed (a refresh doesn't wipe it)
        self.stop_label = QLabel()
        self.stop_label.setObjectName("replicasStop")
        self.stop_label.setWordWrap(True)
        theme.set_role(self.stop_label, "error")
        self.stop_label.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 6, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.error_label)
        layout.addWidget(self.stop_label)
        layout.addLayout(self.grid)
        self.hide()
        self._timer = QTimer(self, interval=int(interval * 1000))
        self._timer.timeout.connect(self.refresh)
        if parent is not None:  # asked again the moment its panel comes back on screen
            parent.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's
        if watched is self.parentWidget() and event.type() == QEvent.Type.Show \
                and self._timer.isActive():
            self.refresh()
        return False

    def start(self) -> None:
        self._timer.start()
        self.refresh()

    def stop(self) -> None:
        self._timer.stop()

    def _wanted(self) -> bool:
        """Ask only while the view would be on screen (its panel shown), or always for a
        view standing alone."""
        host = self.parentWidget()
        return host is None or host.isVisible()

    def refresh(self) -> None:
        """Ask the node now (after a launch), unless a question is on its way."""
        if self._asking or not self._wanted():
            return
        self._asking = True
        self.tasks.run(self.client.replicas, on_done=self._answered, on_error=self._failed,
                       owner=self)

    def _answered(self, info: ReplicasInfo) -> None:
        self._asking = False
        self._timer.setInterval(int(self.interval * 1000))
        self.show_replicas(info)

    def _failed(self, error: BaseException) -> None:
        self._asking = False
        if route_missing(error):  # an older node: it has no copies to show
            self._timer.setInterval(int(OLD_NODE_S * 1000))
            self._show([], None)
            return
        log.info("Reading the replicas failed: %s", error)
        # say so where copies were on screen (or the last word was already this)
        shown = bool(self.groups) or self.error is not None
        self._show([], UNREACHABLE if shown else None, message_of(error))

    def show_replicas(self, info: ReplicasInfo) -> None:
        self._show(copy_rows(info, self.name_of), None)

    def _show(self, groups: list[tuple[str, list[CopyRow]]], error: str | None,
              detail: str = "") -> None:
        self.groups, self.error = groups, error
        self.error_label.setText(error or "")
        self.error_label.setToolTip(detail)
        self.error_label.setVisible(error is not None)
        keys = [(model, c.key) for model, rows in groups for c in rows]
        if keys != list(self._rows) or len(self._headers) != len(groups):
            self._rebuild(groups)
        for model, rows in groups:
            total = sum(c.routed for c in rows)
            for c in rows:
                self._rows[(model, c.key)].show_row(c, total)
        self.setVisible(bool(groups) or error is not None)

    def _rebuild(self, groups: list[tuple[str, list[CopyRow]]]) -> None:
        for w in [*self._headers, *(x for r in self._rows.values() for x in r.widgets())]:
            self.grid.removeWidget(w)
            w.deleteLater()
        self._rows, self._headers = {}, []
        line = 0
        for model, rows in groups:
            header = QLabel(f"{model}: {len(rows)} copies")
            theme.set_role(header, "strong")
            header.setToolTip("Each request goes to the copy that already holds its "
                              "conversation, else to the least busy one.")
            self._headers.append(header)
            self.grid.addWidget(header, line, 0, 1, 7)
            line += 1
            for c in rows:
                row = self._rows[(model, c.key)] = _CopyWidgets()
                row.stop.clicked.connect(
                    lambda _=False, m=model, c=c, w=row: self.stop_copy(m, c, w))
                for col, w in enumerate(row.widgets()):
                    self.grid.addWidget(w, line, col)
                line += 1

    def stop_copy(self, model: str, c: CopyRow, row: _CopyWidgets | None = None) -> None:
        """Stop one copy (off the GUI thread); its row goes at the next refresh, or a
        line says why it couldn't."""
        if row is not None:
            row.stop.setEnabled(False)
            row.stop.setText("Stopping…")
        self.stop_label.hide()

        def failed(error: BaseException) -> None:
            log.info("Stopping the copy of %s on %s failed: %s", model, c.machines, error)
            self.stop_label.setText(f"Couldn't stop the copy of {model} on {c.machines}: "
                                    f"{message_of(error)}")
            self.stop_label.setToolTip(str(error))  # the node's own words
            self.stop_label.show()
            if row is not None and row in self._rows.values():  # still on screen
                row.stop.setEnabled(True)
                row.stop.setText("Stop")
            self.refresh()

        self.tasks.run(self.client.stop_copy, model, c.node,
                       on_done=lambda _info: self.refresh(), on_error=failed, owner=self)
