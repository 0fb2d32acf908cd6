"""A fenced code block in a reply: its language, the code highlighted in a monospace font
(long lines scroll sideways instead of wrapping), and a Copy button that says it copied."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QFontDatabase, QGuiApplication, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.highlight import CodeHighlighter, display_name, language_of

COPIED_MS = 1500


def copy_text(text: str) -> None:
    QGuiApplication.clipboard().setText(text)


class CopyButton(QToolButton):
    """Copy, then "Copied" for a moment: the user sees it worked."""

    def __init__(self, source: Callable[[], str], what: str, parent: QWidget | None = None):
        super().__init__(parent)
        self._source = source  # () -> the text to copy
        self.setText("Copy")
        self.setAccessibleName(f"Copy {what}")
        self.setToolTip(f"Copy {what} to the clipboard")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.clicked.connect(self._copy)
        self._reset = QTimer(self, singleShot=True, interval=COPIED_MS)
        self._reset.timeout.connect(lambda: self.setText("Copy"))

    def _copy(self) -> None:
        copy_text(self._source())
        self.setText("Copied")
        self._reset.start()


class CodeView(QPlainTextEdit):
    """Read-only, as tall as its lines, Tab leaves it (it never types)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setTabChangesFocus(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.horizontalScrollBar().rangeChanged.connect(lambda *_: self.fit_height())

    def fit_height(self) -> None:
        lines = max(self.document().blockCount(), 1)
        height = int(lines * self.fontMetrics().lineSpacing()
                     + 2 * self.document().documentMargin() + 2 * self.frameWidth() + 2)
        if self.horizontalScrollBar().maximum() > 0:
            height += self.horizontalScrollBar().sizeHint().height()
        if self.height() != height:
            self.setFixedHeight(height)


class CodeBlock(QFrame):
    """One fenced block. setText grows it in place while a reply streams."""

    def __init__(self, info: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self.info = info
        self.language = language_of(info)
        name = display_name(info)
        self.language_label = QLabel(name or "code")
        theme.set_role(self.language_label, "code-language")
        self.copy_button = CopyButton(self.text, "code", self)
        self.view = CodeView(self)
        self.view.setAccessibleName(f"{name} code" if name else "Code")
        self.highlighter = CodeHighlighter(self.view.document(), self.language)
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.language_label)
        head.addStretch(1)
        head.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 6, 6)
        layout.setSpacing(2)
        layout.addLayout(head)
        layout.addWidget(self.view)
        self.view.fit_height()

    def text(self) -> str:
        return self.view.toPlainText()

    def setText(self, text: str) -> None:  # noqa: N802 - like QLabel's
        old = self.view.toPlainText()
        if text == old:
            return
        if old and text.startswith(old):  # streaming: append, keep the highlighting done
            cursor = QTextCursor(self.view.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(text[len(old):])
        else:
            self.view.setPlainText(text)
        self.view.fit_height()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.highlighter.refresh_colours()
