"""The models view: models on this node (with whether they fit the cluster), the catalog
and Hub search, and downloads with progress and cancel. The Hub routes are newer than
some nodes: a node without them gets a clear message instead of broken buttons."""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.cluster_state import ClusterState
from app.common import fmt_bytes, fmt_eta, fmt_rate, message_of, route_missing
from app.polling import Poller
from app.snapshots import fit_label
from app.tasks import Tasks
from engine.client import NodeClient
from engine.protocol import DownloadInfo

log = logging.getLogger(__name__)
DOWNLOADS_BUSY_S, DOWNLOADS_IDLE_S = 1.0, 5.0
NO_HUB = ("Downloads need a newer node: this node has no Hugging Face routes "
          "(/shoal/hub/...). Models already on disk are listed above; import more with "
          "`shoal models import FILE.gguf`.")


def _table(headers: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    t.verticalHeader().hide()
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    t.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
    return t


def _button(text: str, slot: Any) -> QPushButton:
    b = QPushButton(text)
    b.clicked.connect(slot)
    return b


class ModelsView(QWidget):
    chat_requested = Signal(str)
    plan_requested = Signal(str)
    downloading_changed = Signal(bool)

    def __init__(self, client: NodeClient, tasks: Tasks, state: ClusterState,
                 api_key: str | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.tasks, self.state = client, tasks, state
        self.local: list[dict[str, Any]] = []
        self.catalog: list[dict[str, Any]] = []
        self.downloads: list[dict[str, Any]] = []
        self.hub_available: bool | None = None  # unknown until the node answers
        self.downloading = False

        self.local_table = _table(["Model", "Size", "Layers", "Quantization", "Context",
                                   "Fits", ""])
        self.local_message = QLabel()
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search the catalog and the Hugging Face Hub "
                                            "(e.g. qwen 4bit)")
        self.search_edit.returnPressed.connect(self.search)
        self.search_button = _button("Search", self.search)
        self.catalog_table = _table(["Model", "Parameters", "Quantization", "Size", "Fits",
                                     "On disk", ""])
        self.hub_message = QLabel()
        self.hub_message.setObjectName("hubMessage")
        self.hub_message.setWordWrap(True)
        self.downloads_table = _table(["Download", "Progress", "Speed", "ETA", "State", ""])
        self.downloads_table.setMaximumHeight(160)
        search = QHBoxLayout()
        search.addWidget(self.search_edit, 1)
        search.addWidget(self.search_button)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("<b>On this node</b>"))
        layout.addWidget(self.local_table, 2)
        layout.addWidget(self.local_message)
        layout.addWidget(QLabel("<b>Catalog and Hugging Face Hub</b>"))
        layout.addLayout(search)
        layout.addWidget(self.hub_message)
        layout.addWidget(self.catalog_table, 3)
        layout.addWidget(QLabel("<b>Downloads</b>"))
        layout.addWidget(self.downloads_table, 1)

        self.poller = Poller(tasks, client.base_url, lambda c: c.hub_downloads(),
                             DOWNLOADS_IDLE_S, api_key=api_key, parent=self)
        self.poller.updated.connect(self._fill_downloads)
        self.poller.failed.connect(self._downloads_failed)
        state.changed.connect(self._refit)

    def start(self) -> None:
        self.refresh()
        self.poller.start()

    def stop(self) -> None:
        self.poller.stop()

    def refresh(self) -> None:
        """The local list, and the catalog (or the current search) with what is on disk."""
        self.refresh_local()
        self.search()

    def refresh_local(self) -> None:
        self.tasks.run(self.client.models, on_done=self._fill_local,
                       on_error=lambda e: self.local_message.setText(
                           f"Couldn't list the models: {message_of(e)}"), owner=self)

    # --- local models ---------------------------------------------------------------------
    def _fill_local(self, models: list[dict[str, Any]]) -> None:
        self.local = models
        self.local_message.setText("" if models else "No models yet: download one below, "
                                   "or import a GGUF file with `shoal models import`.")
        t = self.local_table
        t.setRowCount(len(models))
        for i, m in enumerate(models):
            info = m.get("shoal") or {}
            cells = [str(m.get("id")), fmt_bytes(info.get("size_bytes")),
                     str(info.get("layers") or "?"), str(info.get("quantization") or "?"),
                     str(info.get("context_length") or "?")]
            for j, text in enumerate(cells):
                t.setItem(i, j, QTableWidgetItem(text))
            model = str(m.get("id"))
            actions = QWidget()
            row = QHBoxLayout(actions)
            row.setContentsMargins(2, 0, 2, 0)
            row.addWidget(_button("Chat", lambda _c=False, m=model: self.chat_requested.emit(m)))
            row.addWidget(_button("Plan", lambda _c=False, m=model: self.plan_requested.emit(m)))
            row.addWidget(_button("Delete", lambda _c=False, m=model: self.delete(m)))
            t.setCellWidget(i, 6, actions)
        self._refit()

    def _refit(self) -> None:
        """The Fits column follows the cluster (nodes come and go, memory frees up)."""
        cards = self.state.cards()
        for i, m in enumerate(self.local):
            info = m.get("shoal") or {}
            text = ("running across nodes" if info.get("instance") else
                    fit_label(info.get("size_bytes"), cards))
            item = self.local_table.item(i, 5)
            if item is None or item.text() != text:
                self.local_table.setItem(i, 5, QTableWidgetItem(text))

    def delete(self, model: str) -> None:
        def failed(e: BaseException) -> None:
            self.local_message.setText(
                "Deleting models needs a newer node." if route_missing(e) else
                f"Couldn't delete {model}: {message_of(e)}")

        def done(r: dict[str, Any]) -> None:
            self.local_message.setText(f"Deleted {model} ({fmt_bytes(r.get('freed_bytes'))} "
                                       "freed).")
            self.refresh()
        self.tasks.run(self.client.remove_model, model, on_done=done, on_error=failed, owner=self)

    # --- catalog and search ---------------------------------------------------------------
    def search(self) -> None:
        q = self.search_edit.text().strip()
        if not q:
            self.tasks.run(self.client.hub_catalog, on_done=self._fill_catalog,
                           on_error=self._hub_failed, owner=self)
            return
        self.hub_message.setText(f"Searching for “{q}”…")
        self.tasks.run(self.client.hub_search, q, on_done=self._fill_catalog,
                       on_error=self._hub_failed, owner=self)

    def _hub_failed(self, error: BaseException) -> None:
        if route_missing(error):
            self._no_hub()
        else:
            self.hub_message.setText(f"The catalog isn't available: {message_of(error)}")

    def _no_hub(self) -> None:
        self.hub_available = False
        self.hub_message.setText(NO_HUB)
        self.hub_message.setStyleSheet("color: #b05a00;")
        for w in (self.search_edit, self.search_button, self.catalog_table,
                  self.downloads_table):
            w.setEnabled(False)
        self.poller.stop()

    def _fill_catalog(self, found: dict[str, Any]) -> None:
        self.hub_available = True
        self.catalog = list(found.get("models") or [])
        error = found.get("hub_error")
        self.hub_message.setStyleSheet("color: #b05a00;" if error else "")
        self.hub_message.setText(f"The Hub didn't answer ({error}); showing the catalog and "
                                 "models on disk." if error else
                                 f"{len(self.catalog)} model(s).")
        t = self.catalog_table
        t.setRowCount(len(self.catalog))
        for i, m in enumerate(self.catalog):
            params = m.get("parameters")
            fits = m.get("fits")
            where = ", ".join(str(x.get("node") or x.get("source")) for x in m.get("local") or [])
            cells = [str(m.get("id")), f"{params / 1e9:.1f}B" if params else "?",
                     str(m.get("quantization") or "?"), fmt_bytes(m.get("size_bytes")),
                     "?" if fits is None else "yes" if fits else "too big", where or "—"]
            for j, text in enumerate(cells):
                t.setItem(i, j, QTableWidgetItem(text))
            repo = str(m.get("id"))
            # Only Hub repositories download; a model imported into Shoal's folder is done.
            if repo.count("/") == 1 and not any(x.get("source") == "shoal"
                                                for x in m.get("local") or []):
                t.setCellWidget(i, 6, _button("Download",
                                              lambda _c=False, r=repo: self.pull(r)))
            else:
                t.removeCellWidget(i, 6)

    def pull(self, repo: str) -> None:
        def failed(e: BaseException) -> None:
            if route_missing(e):
                self._no_hub()
            else:
                self.hub_message.setText(f"Couldn't download {repo}: {message_of(e)}")
        self.tasks.run(self.client.hub_pull, repo, on_done=lambda _d: self.poller.poke(),
                       on_error=failed, owner=self)
        self.poller.interval = DOWNLOADS_BUSY_S

    # --- downloads ------------------------------------------------------------------------
    def _downloads_failed(self, error: BaseException) -> None:
        if route_missing(error):
            self._no_hub()

    def _fill_downloads(self, downloads: list[DownloadInfo]) -> None:
        self.downloads = sorted(downloads, key=lambda d: -float(d.get("started") or 0))
        running = any(d.get("state") == "running" for d in downloads)
        self.poller.interval = DOWNLOADS_BUSY_S if running else DOWNLOADS_IDLE_S
        if running != self.downloading:
            self.downloading = running
            self.downloading_changed.emit(running)
            if not running:
                self.refresh()  # a finished download is a new local model
        t = self.downloads_table
        t.setRowCount(len(self.downloads))
        for i, d in enumerate(self.downloads):
            p = d.get("progress") or {}
            done, total = int(p.get("done") or 0), int(p.get("total") or 0)
            bar = t.cellWidget(i, 1)
            if not isinstance(bar, QProgressBar):
                bar = QProgressBar()
                bar.setRange(0, 1000)
                t.setCellWidget(i, 1, bar)
            bar.setValue(int(1000 * done / total) if total else 0)
            bar.setFormat(f"{fmt_bytes(done)} / {fmt_bytes(total)}" if total else "starting")
            state = d.get("state") or "?"
            if d.get("error"):
                state += f": {(d['error'] or {}).get('message', '')}"
            t.setItem(i, 0, QTableWidgetItem(str(d.get("repo"))))
            t.setItem(i, 2, QTableWidgetItem(fmt_rate(p.get("speed_Bps"))))
            t.setItem(i, 3, QTableWidgetItem(fmt_eta(p.get("eta_s"))))
            t.setItem(i, 4, QTableWidgetItem(state))
            did = str(d.get("id"))
            cancel = t.cellWidget(i, 5)
            if d.get("state") != "running":
                t.removeCellWidget(i, 5)
            elif cancel is None or cancel.property("download") != did:
                cancel = _button("Cancel", lambda _c=False, x=did: self.cancel(x))
                cancel.setProperty("download", did)
                t.setCellWidget(i, 5, cancel)

    def cancel(self, download_id: str) -> None:
        self.tasks.run(self.client.hub_cancel, download_id,
                       on_done=lambda _d: self.poller.poke(),
                       on_error=lambda e: self.hub_message.setText(
                           f"Couldn't cancel: {message_of(e)}"), owner=self)
