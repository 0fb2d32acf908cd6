"""The pictures waiting to go with the next chat message: the Image… button (a file
dialog), what a paste or a drop brings, their thumbnails above the message box (each
removable), and a sentence for any picture the app refused and why."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, Signal
from PySide6.QtWidgets import QFileDialog, QLabel, QPushButton, QVBoxLayout, QWidget

from app import theme
from app.attachments import DIALOG_FILTER, MAX_IMAGES, Image, mime_sources, read_all
from app.image_strip import PENDING_PX, ImageStrip
from app.tasks import Tasks

TAKES = "Attach a PNG, JPEG, WebP or GIF picture (or paste or drop one in the chat)"


class PendingImages(QWidget):
    """Pictures for the next message. changed() when the list changes."""

    changed = Signal()

    def __init__(self, tasks: Tasks, parent: QWidget | None = None):
        super().__init__(parent)
        self.tasks = tasks
        self.images: list[Image] = []
        self.reading = 0  # pictures being checked off the GUI thread
        self.button = QPushButton("Image…")
        self.button.setAccessibleName("Attach an image")
        self.button.setToolTip(TAKES)
        self.button.clicked.connect(self.choose_files)
        self.strip = ImageStrip(PENDING_PX, removable=True)
        self.strip.removed.connect(self.remove)
        self.note = QLabel()
        self.note.setObjectName("attachNote")
        self.note.setWordWrap(True)
        theme.set_role(self.note, "error")
        self.note.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.strip)
        layout.addWidget(self.note)

    # --- what the model takes ---------------------------------------------------------------
    def set_model(self, model: str | None, takes_images: bool | None) -> None:
        """Say on the button whether `model` takes images (None: not known yet). The
        button stays enabled: the node's answer is the last word, and says which do."""
        if takes_images is False and model:
            self.button.setToolTip(f"{model} doesn't take images: a message with one gets "
                                   "the node's refusal. Models marked 'vision' in Models "
                                   "do.")
        else:
            self.button.setToolTip(TAKES)

    # --- adding -----------------------------------------------------------------------------
    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self.window(), "Attach images", "",
                                                DIALOG_FILTER)
        if paths:
            self._read(paths, None)

    def take_mime(self, mime: QMimeData) -> None:
        """A paste or a drop: its image files, or its picture."""
        files, picture = mime_sources(mime)
        if files or picture is not None:
            self._read(files, picture)

    def _read(self, files: list[str], picture: object) -> None:
        self.reading += 1
        self.changed.emit()
        self.tasks.run(read_all, files, picture, on_done=self._read_done,
                       on_error=self._read_failed, owner=self)

    def _read_done(self, found: tuple[list[Image], list[str]]) -> None:
        self.reading -= 1
        self.add(*found)

    def _read_failed(self, error: BaseException) -> None:
        self.reading -= 1
        self.add([], [f"The image couldn't be read: {error}."])

    def add(self, images: list[Image], refused: list[str] | None = None) -> None:
        """Add pictures (one already waiting isn't added twice) and say what was refused."""
        refused = list(refused or [])
        for image in images:
            if any(i.name == image.name for i in self.images):
                continue
            if len(self.images) >= MAX_IMAGES:
                refused.append(f"{image.label} wasn't added: a message takes up to "
                               f"{MAX_IMAGES} images.")
                continue
            self.images.append(image)
        self.note.setText(" ".join(refused))
        self.note.setVisible(bool(refused))
        self._show()

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.images):
            del self.images[index]
            self.note.hide()
            self._show()

    # --- sending ----------------------------------------------------------------------------
    def take(self) -> list[Image]:
        """The pictures, for the message being sent; the strip empties."""
        images, self.images = self.images, []
        self.note.hide()
        self._show()
        return images

    def put_back(self, images: list[Image]) -> None:
        """Pictures of a message that wasn't sent after all, first in the strip again."""
        self.images = images + [i for i in self.images if i not in images]
        self._show()

    def _show(self) -> None:
        self.strip.set_images([(i.data, _label(i)) for i in self.images])
        self.changed.emit()


def _label(image: Image) -> str:
    if image.reduced_from is None:
        return image.label
    w, h = image.reduced_from
    return (f"{image.label} (sent at {image.width} x {image.height}: the {w} x {h} original "
            "is larger than a request to the node can carry)")
