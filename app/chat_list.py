"""The chat pane's left side: the saved conversations, newest first, with New and Delete
under them, and after a delete a bar that offers Undo for a while.

It shows and picks; what New, Delete and Undo do to the conversations is the chat pane's
(app/chat.py), which connects the buttons and calls select(), offer_undo() and
take_deleted().
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.conversations import Conversation, ConversationStore
from app.notice import NoticeBar


class ConversationList(QWidget):
    """The conversations of `store`; `chosen(conversation or None)` when the current one
    changes in the list."""

    chosen = Signal(object)

    def __init__(self, store: ConversationStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self._deleted: tuple[Conversation, int] | None = None  # what Undo brings back
        self.list = QListWidget()
        self.list.setAccessibleName("Conversations")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.currentItemChanged.connect(self._on_current)
        self.new_button = QPushButton("New")
        self.new_button.setToolTip("New conversation (Ctrl+N)")
        self.new_button.setAccessibleName("New conversation")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setAccessibleName("Delete this conversation")
        self.undo_bar = NoticeBar("undoDelete")
        lv = QVBoxLayout(self)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(self.list)
        row = QHBoxLayout()
        row.addWidget(self.new_button)
        row.addWidget(self.delete_button)
        lv.addLayout(row)
        lv.addWidget(self.undo_bar)

    def fill(self) -> None:
        """List the store's conversations again (no `chosen` while doing so)."""
        self.list.blockSignals(True)
        self.list.clear()
        for conv in self.store.conversations:
            item = QListWidgetItem(conv.title)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            self.list.addItem(item)
        self.list.blockSignals(False)

    def select(self, conv: Conversation | None) -> bool:
        """List again and make `conv` current (none when None); whether one is."""
        self.fill()
        row = self.store.conversations.index(conv) if conv else -1
        self.list.setCurrentRow(row)
        return row >= 0

    def set_current_title(self, title: str) -> None:
        self.list.currentItem().setText(title)

    def offer_undo(self, conv: Conversation, index: int, undo: Callable[[], None],
                   timeout_ms: int) -> None:
        """`conv`, deleted from `index`: the bar offers Undo (which calls `undo`) for
        `timeout_ms`."""
        self._deleted = (conv, index)
        title = conv.title if len(conv.title) <= 40 else conv.title[:39] + "…"
        self.undo_bar.show_notice(f"Deleted “{title}”.", "Undo", undo, timeout_ms)

    def take_deleted(self) -> tuple[Conversation, int] | None:
        """The last deleted conversation and where it was (None when there is none); the
        Undo bar goes."""
        if self._deleted is None:
            return None
        deleted, self._deleted = self._deleted, None
        self.undo_bar.dismiss()
        return deleted

    def _on_current(self, item: QListWidgetItem | None, _previous: object = None) -> None:
        self.chosen.emit(self.store.get(item.data(Qt.ItemDataRole.UserRole)) if item else None)
