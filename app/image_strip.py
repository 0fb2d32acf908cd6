"""A row of image thumbnails: the pictures waiting to be sent above the message box (each
with a remove button), and the pictures of a sent message in the conversation."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from app import theme
from app.attachments import thumbnail

PENDING_PX = 64  # a waiting picture's thumbnail side
SENT_PX = 160  # a sent one's, in the conversation


class ImageTile(QFrame):
    """One thumbnail, and its remove button where the strip offers one."""

    remove_requested = Signal(object)  # this tile

    def __init__(self, data: bytes, label: str, side: int, removable: bool,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.label = label
        self.picture = QLabel()
        pixmap = thumbnail(data, side)
        if pixmap.isNull():  # a kept file damaged or gone: say so in its place
            self.picture.setText("Image missing")
            theme.set_role(self.picture, "muted")
        else:
            self.picture.setPixmap(pixmap)
        self.picture.setToolTip(label)
        self.picture.setAccessibleName(f"Image: {label}")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(self.picture)
        self.remove_button: QToolButton | None = None
        if removable:
            self.remove_button = QToolButton()
            self.remove_button.setText("×")
            self.remove_button.setAutoRaise(True)
            self.remove_button.setToolTip(f"Remove {label}")
            self.remove_button.setAccessibleName(f"Remove {label}")
            self.remove_button.clicked.connect(lambda: self.remove_requested.emit(self))
            column = QVBoxLayout()
            column.addWidget(self.remove_button)
            column.addStretch(1)
            row.addLayout(column)


class ImageStrip(QWidget):
    """Thumbnails in a row, hidden while empty. removed(index) when the user removes one
    (the owner drops it from its list and calls set_images again)."""

    removed = Signal(int)

    def __init__(self, side: int, removable: bool, parent: QWidget | None = None):
        super().__init__(parent)
        self.side, self.removable = side, removable
        self.tiles: list[ImageTile] = []
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(6)
        self.row.addStretch(1)
        self.hide()

    def set_images(self, images: list[tuple[bytes, str]]) -> None:
        """Show these (data, label) pictures, in order."""
        for tile in self.tiles:
            self.row.removeWidget(tile)
            tile.hide()
            tile.deleteLater()
        self.tiles = []
        for i, (data, label) in enumerate(images):
            tile = ImageTile(data, label, self.side, self.removable, self)
            tile.remove_requested.connect(self._remove)
            self.row.insertWidget(i, tile, 0, Qt.AlignmentFlag.AlignBottom)
            tile.show()  # at once, not when the layout gets round to it
            self.tiles.append(tile)
        self.setVisible(bool(images))

    def _remove(self, tile: ImageTile) -> None:
        if tile in self.tiles:
            self.removed.emit(self.tiles.index(tile))
