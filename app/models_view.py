"""The models view: one list of every model (the catalog, the Hub's search results and
what is on disk), grouped by family, with a badge per variant for whether it fits this
machine, filters, and one click to download and chat; downloads with progress and
cancel below. The Hub routes are newer than some nodes: a node without them gets a clear
message instead of broken buttons; a machine offline gets one calm line."""

from __future__ import annotations

import logging
import sys
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QPushButton,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.catalog import FILTERS, Badge, Variant, capabilities_of, group, matches
from app.cluster_state import ClusterState
from app.common import fmt_bytes, message_of, route_missing
from app.downloads import DownloadsPanel
from app.polling import Poller
from app.tasks import Tasks
from engine.client import NodeClient
from engine.records import CatalogInfo, CatalogModel, DownloadInfo, FilesAt, ModelCard, RemovedInfo

log = logging.getLogger(__name__)
DOWNLOADS_BUSY_S, DOWNLOADS_IDLE_S = 1.0, 5.0
NO_HUB = ("Downloads need a newer node: this node has no Hugging Face routes "
          "(/shoal/hub/...). Models already on disk are listed above; import more with "
          "`shoal models import FILE.gguf`.")
OFFLINE = ("Offline: the Hugging Face Hub can't be reached, so this is the curated catalog "
           "and what is on your machines.")
ID = Qt.ItemDataRole.UserRole


def _button(text: str, slot: Any, name: str | None = None) -> QPushButton:
    b = QPushButton(text)
    b.clicked.connect(slot)
    if name:
        b.setAccessibleName(name)
    return b


class Badges(QWidget):
    """A row of small labelled badges; set() only touches what changed."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(2, 0, 2, 0)
        self.row.setSpacing(4)
        self.row.addStretch(1)
        self.shown: list[Badge] = []

    def set(self, badges: list[Badge]) -> None:
        if badges == self.shown:
            return
        while self.row.count() > 1:
            w = self.row.takeAt(0).widget()
            w.deleteLater()
        for i, b in enumerate(badges):
            label = QLabel(b.text)
            label.setToolTip(b.tip)
            theme.set_role(label, f"badge-{b.kind}")
            self.row.insertWidget(i, label)
        self.shown = list(badges)

    def texts(self) -> list[str]:
        return [b.text for b in self.shown]


class ModelsView(QWidget):
    chat_requested = Signal(str)
    plan_requested = Signal(str)
    downloading_changed = Signal(bool)
    download_progress = Signal(object)  # "Downloading X: 42%" or None, for the tray

    def __init__(self, client: NodeClient, tasks: Tasks, state: ClusterState,
                 api_key: str | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.tasks, self.state = client, tasks, state
        self.local: list[ModelCard] = []
        self.catalog: list[CatalogModel] = []
        self.downloads: list[DownloadInfo] = []
        self.hub_available: bool | None = None  # unknown until the node answers
        self.offline = False
        self.notice: str | None = None  # what the user's last action did, before the count
        self.downloading = False
        self.chat_after: dict[str, str] = {}  # download id -> model to chat with when done
        self.items: dict[str, QTreeWidgetItem] = {}
        self._ready: str | None = None  # the model the node last reported ready

        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Filter, or search the Hugging Face Hub with "
                                            "Enter (e.g. qwen 4bit)")
        self.search_edit.setAccessibleName("Search models")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.textChanged.connect(lambda _t: self._apply_filters())
        self.search_edit.returnPressed.connect(self._user_search)
        self.search_button = _button("Search the Hub", self._user_search)
        self.filter_boxes: dict[str, QCheckBox] = {}
        filters = QHBoxLayout()
        filters.addWidget(QLabel("Show only:"))
        for key, text in FILTERS:
            box = self.filter_boxes[key] = QCheckBox(text)
            box.toggled.connect(lambda _on: self._apply_filters())
            filters.addWidget(box)
        filters.addStretch(1)
        self.hub_message = QLabel()
        self.hub_message.setObjectName("hubMessage")
        self.hub_message.setWordWrap(True)
        theme.set_role(self.hub_message, "muted")
        self.tree = QTreeWidget()
        self.tree.setAccessibleName("Models")
        self.tree.setColumnCount(4)
        self.tree.setHeaderLabels(["Model", "Size", "", ""])
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in (1, 2, 3):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.setUniformRowHeights(False)
        self.downloads_panel = DownloadsPanel()
        self.downloads_panel.cancel_requested.connect(self.cancel)
        self.downloads_panel.retry_requested.connect(self._retry)
        self.retry_chat: set[str] = set()  # failed "Download and chat": chat after a retry
        self.delete_box: QMessageBox | None = None  # the confirmation on screen, if any
        search = QHBoxLayout()
        search.addWidget(self.search_edit, 1)
        search.addWidget(self.search_button)
        layout = QVBoxLayout(self)
        layout.addLayout(search)
        layout.addLayout(filters)
        layout.addWidget(self.hub_message)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.downloads_panel)

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

    def follow_status(self, status: dict[str, Any]) -> None:
        """A model the node just made ready (the default one imported on first run, a
        load) joins the list, downloaded."""
        runner = status.get("runner") or {}
        ready = runner.get("model") if runner.get("type") == "Ready" else None
        if ready and ready != self._ready and self.hub_available is not None and \
                ready not in self.items:
            self.refresh()
        self._ready = ready

    def refresh_local(self) -> None:
        self.tasks.run(self.client.models, on_done=self._fill_local,
                       on_error=lambda e: self.hub_message.setText(
                           f"Couldn't list the models: {message_of(e)}"), owner=self)

    def _fill_local(self, models: list[ModelCard]) -> None:
        self.local = models
        if self.hub_available is False:  # no catalog from this node: the local list alone
            self.catalog = [CatalogModel(m.id, m.id, source="local", local=[FilesAt("shoal")],
                                         size_bytes=m.shoal.size_bytes,
                                         quantization=m.shoal.quantization,
                                         capabilities=m.shoal.capabilities)
                            for m in models]
            self._fill_tree()

    # --- the list ---------------------------------------------------------------------------
    def _user_search(self) -> None:
        self.notice = None  # the user moved on: what they did before is old news
        self.search()

    def search(self) -> None:
        q = self.search_edit.text().strip()
        if self.hub_available is False:
            return
        if not q:
            self.tasks.run(self.client.hub_catalog, on_done=self._fill_catalog,
                           on_error=self._hub_failed, owner=self)
            return
        self.hub_message.setText(f"Searching the Hub for “{q}”…")
        self.tasks.run(self.client.hub_search, q, on_done=self._fill_catalog,
                       on_error=self._hub_failed, owner=self)

    def _hub_failed(self, error: BaseException) -> None:
        if route_missing(error):
            self._no_hub()
        else:
            self.hub_message.setText(f"The model list isn't available: {message_of(error)}")

    def _no_hub(self) -> None:
        self.hub_available = False
        self.hub_message.setText(NO_HUB)
        theme.set_role(self.hub_message, "warning")
        for w in (self.search_button, self.downloads_panel):
            w.setEnabled(False)
        self.poller.stop()
        self._fill_local(self.local)

    def _fill_catalog(self, found: CatalogInfo) -> None:
        self.hub_available = True
        self.catalog = list(found.models)
        self.offline = bool(found.hub_error)
        self._fill_tree()

    def _fill_tree(self) -> None:
        """Rebuild the list (after a search or a new catalog), keeping the scroll place."""
        bar = self.tree.verticalScrollBar().value()
        self.tree.clear()
        self.items = {}
        for fam in group(self.catalog, self.state.cards()):
            top = QTreeWidgetItem([fam.name])
            font = top.font(0)
            font.setBold(True)
            top.setFont(0, font)
            top.setFlags(top.flags() & ~Qt.ItemFlag.ItemIsSelectable)
            self.tree.addTopLevelItem(top)
            for v in fam.variants:
                self._add_variant(top, v)
            top.setExpanded(True)
        self._apply_filters()
        self.tree.verticalScrollBar().setValue(bar)

    def _add_variant(self, parent: QTreeWidgetItem, v: Variant) -> None:
        item = QTreeWidgetItem([v.label, self._size_text(v)])
        item.setData(0, ID, v.id)
        item.setToolTip(0, v.id)
        parent.addChild(item)
        self.items[v.id] = item
        badges = Badges()
        badges.set(v.badges())
        self.tree.setItemWidget(item, 2, badges)
        self.tree.setItemWidget(item, 3, self._actions(v))
        item.setData(1, ID, v)

    @staticmethod
    def _size_text(v: Variant) -> str:
        params = v.entry.parameters
        size = fmt_bytes(v.entry.size_bytes) if v.entry.size_bytes else ""
        return " · ".join(x for x in (f"{params / 1e9:.1f}B" if params else "", size) if x)

    def _actions(self, v: Variant) -> QWidget:
        """The variant's one main action, and the others in a menu."""
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(2, 0, 2, 0)
        repo = v.id
        hub = repo.count("/") == 1 and not any(x.source == "shoal" for x in v.entry.local)
        caps = capabilities_of(v.entry.capabilities)
        if v.downloaded and caps is not None and "generate" not in caps:
            main = _button("Serves search", lambda: None, f"{repo} doesn't chat")
            main.setEnabled(False)  # an embedding model or reranker has no chat to open
            main.setToolTip("An embedding or reranking model: the node serves it beside "
                            "the chat model (/v1/embeddings, /v1/rerank); it doesn't chat.")
        elif v.downloaded:
            main = _button("Chat", lambda: self.chat_requested.emit(repo), f"Chat with {repo}")
        elif v.fit.kind == "error":
            main = _button("Too large", lambda: None, f"{repo} is too large")
            main.setEnabled(False)  # a download that can never run is no help
            main.setToolTip(v.fit.tip)
        elif v.fit.kind in ("ok", "plain") and hub:  # fits, or its size is unknown
            main = _button("Download and chat", lambda: self.pull(repo, chat=True),
                           f"Download {repo} and chat with it")
        else:
            main = _button("Download", lambda: self.pull(repo), f"Download {repo}")
            main.setEnabled(hub)
        main.setObjectName("mainAction")
        more = QToolButton()
        more.setText("⋯")
        more.setAccessibleName(f"More for {repo}")
        more.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(more)
        menu.addAction("Plan a placement", lambda: self.plan_requested.emit(repo))
        if hub and not v.downloaded:
            menu.addAction("Download only", lambda: self.pull(repo))
        if v.downloaded:
            menu.addAction("Delete from this machine", lambda: self.delete(repo))
        more.setMenu(menu)
        row.addWidget(main)
        row.addWidget(more)
        return box

    def action_button(self, model: str) -> QPushButton | None:
        item = self.items.get(model)
        box = self.tree.itemWidget(item, 3) if item is not None else None
        return box.findChild(QPushButton, "mainAction") if box is not None else None

    def badges_of(self, model: str) -> list[str]:
        item = self.items.get(model)
        return self.tree.itemWidget(item, 2).texts() if item is not None else []

    def shown_models(self) -> list[str]:
        return [m for m, item in self.items.items() if not item.isHidden()]

    def _apply_filters(self) -> None:
        words = self.search_edit.text().lower().split()
        chosen = {k for k, box in self.filter_boxes.items() if box.isChecked()}
        shown = 0
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            visible = 0
            for j in range(top.childCount()):
                child = top.child(j)
                ok = matches(child.data(1, ID), words, chosen)
                child.setHidden(not ok)
                visible += ok
            top.setHidden(visible == 0)
            top.setText(1, f"{visible} variant{'s' if visible != 1 else ''}")
            shown += visible
        self._say_count(shown)

    def _say_count(self, shown: int) -> None:
        if self.hub_available is False:
            return
        total = len(self.items)
        count = f"{shown} of {total} models" if shown != total else f"{total} models"
        theme.set_role(self.hub_message, "muted")
        text = f"{count}. {OFFLINE}" if self.offline else f"{count}."
        self.hub_message.setText(f"{self.notice} {text}" if self.notice else text)

    def _refit(self) -> None:
        """Badges follow the cluster (nodes come and go, memory frees up)."""
        if not self.items:
            return
        for fam in group(self.catalog, self.state.cards()):
            for v in fam.variants:
                item = self.items.get(v.id)
                if item is None:
                    continue
                old = item.data(1, ID)
                item.setData(1, ID, v)
                self.tree.itemWidget(item, 2).set(v.badges())
                if old is None or (old.fit.kind, old.downloaded) != (v.fit.kind, v.downloaded):
                    self.tree.setItemWidget(item, 3, self._actions(v))

    def delete(self, model: str) -> None:
        """Ask first, with the model's size: deleting can't be undone."""
        size = self._size_of(model)
        place = "this Mac" if sys.platform == "darwin" else "this computer"
        box = QMessageBox(QMessageBox.Icon.Warning, "Delete model",
                          f"Delete {model.split('/')[-1]}"
                          + (f" ({fmt_bytes(size)})" if size else "")
                          + f"? This removes the files from {place}.",
                          QMessageBox.StandardButton.Cancel, self)
        box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.buttonClicked.connect(lambda b: self._confirmed(
            model, box.buttonRole(b) == QMessageBox.ButtonRole.DestructiveRole))
        box.rejected.connect(lambda: self._confirmed(model, False))  # Esc, or closed
        self.delete_box = box
        box.open()

    def _size_of(self, model: str) -> int | None:
        entry = next((e for e in self.catalog if e.id == model), None)
        card = next((m for m in self.local if m.id == model), None)
        return (entry.size_bytes if entry else None) or (card.shoal.size_bytes if card
                                                           else None)

    def _confirmed(self, model: str, yes: bool) -> None:
        self.delete_box = None
        if yes:
            self._delete(model)

    def _delete(self, model: str) -> None:
        def failed(e: BaseException) -> None:
            self.hub_message.setText("Deleting models needs a newer node." if route_missing(e)
                                     else f"Couldn't delete {model}: {message_of(e)}")

        def done(r: RemovedInfo) -> None:
            self.notice = f"Deleted {model} ({fmt_bytes(r.freed_bytes)} freed)."
            self.hub_message.setText(self.notice)
            self.refresh()
        self.tasks.run(self.client.remove_model, model, on_done=done, on_error=failed,
                       owner=self)

    def pull(self, repo: str, chat: bool = False) -> None:
        def failed(e: BaseException) -> None:
            if route_missing(e):
                self._no_hub()
            else:
                self.hub_message.setText(f"Couldn't download {repo}: {message_of(e)}")

        def started(d: DownloadInfo) -> None:
            if chat:
                self.chat_after[d.id] = repo
            self.poller.poke()
        self.tasks.run(self.client.hub_pull, repo, on_done=started, on_error=failed,
                       owner=self)
        self.poller.interval = DOWNLOADS_BUSY_S

    # --- downloads ------------------------------------------------------------------------
    def _downloads_failed(self, error: BaseException) -> None:
        if route_missing(error):
            self._no_hub()

    def _fill_downloads(self, downloads: list[DownloadInfo]) -> None:
        self.downloads = sorted(downloads, key=lambda d: -float(d.started))
        running = [d for d in downloads if d.state == "running"]
        self.poller.interval = DOWNLOADS_BUSY_S if running else DOWNLOADS_IDLE_S
        if bool(running) != self.downloading:
            self.downloading = bool(running)
            self.downloading_changed.emit(self.downloading)
            if not running:
                self.refresh()  # a finished download is a new local model
        self.download_progress.emit(self._progress_line(running))
        for d in downloads:
            if d.id in self.chat_after and d.state in ("done", "failed", "cancelled"):
                repo = self.chat_after.pop(d.id)
                if d.state == "done":
                    self.chat_requested.emit(repo)
                else:
                    self.retry_chat.add(repo)
        self.downloads_panel.set_downloads(downloads)

    def _retry(self, repo: str) -> None:
        chat = repo in self.retry_chat
        self.retry_chat.discard(repo)
        self.pull(repo, chat=chat)

    @staticmethod
    def _progress_line(running: list[DownloadInfo]) -> str | None:
        if not running:
            return None
        d = running[0]
        done, total = (d.progress.done, d.progress.total) if d.progress else (0, 0)
        name = d.repo.split("/")[-1]
        more = f" (+{len(running) - 1} more)" if len(running) > 1 else ""
        return (f"Downloading {name}: {100 * done // total}%{more}" if total else
                f"Downloading {name}…{more}")

    def cancel(self, download_id: str) -> None:
        self.tasks.run(self.client.hub_cancel, download_id,
                       on_done=lambda _d: self.poller.poke(),
                       on_error=lambda e: self.hub_message.setText(
                           f"Couldn't cancel: {message_of(e)}"), owner=self)
