"""ErrorNote: an error in a person's words (app/sentences.py), with its technical text one
click away, for the views that show a failure next to what caused it."""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QFontDatabase, QResizeEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QStatusBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.sentences import Explained, explain


class ErrorNote(QWidget):
    """A sentence, and a Details toggle that reveals the technical text below it; both
    selectable, so they can be copied into a bug report."""

    def __init__(self, parent: QWidget | None = None, role: str | None = "error"):
        super().__init__(parent)
        self._refit_due = False
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        theme.set_role(self.text, role)
        self.details_button = QToolButton()
        self.details_button.setText("Details")
        self.details_button.setCheckable(True)
        self.details_button.setAccessibleName("Show the technical details")
        self.details_button.toggled.connect(self._toggle)
        self.detail = QLabel()
        self.detail.setWordWrap(True)
        self.detail.setTextFormat(Qt.TextFormat.PlainText)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                            | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.detail.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.detail.setAccessibleName("Technical details")
        theme.set_role(self.detail, "muted")
        self.detail.hide()
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.text, 1)
        row.addWidget(self.details_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(row)
        layout.addWidget(self.detail)
        layout.addStretch(1)  # a tall parent (a status bar) adds room below, not between
        self.set_text("", "")

    def show_error(self, error: BaseException | str, names: Mapping[str, str] | None = None,
                   prefix: str = "") -> Explained:
        """Show `error` in a person's words (after `prefix`, e.g. "Couldn't load m: ")."""
        explained = explain(error, names)
        self.set_text(prefix + explained.sentence, explained.detail)
        return explained

    def set_text(self, sentence: str, detail: str = "") -> None:
        self.text.setText(sentence)
        self.detail.setText(detail)
        self.details_button.setVisible(bool(detail))
        if not detail:
            self.details_button.setChecked(False)
        self.detail.setVisible(bool(detail) and self.details_button.isChecked())
        self._fit()

    def clear(self) -> None:
        self.set_text("", "")

    def _toggle(self, shown: bool) -> None:
        self.detail.setVisible(shown and bool(self.detail.text()))
        self._fit()

    def _fit(self) -> None:
        self.updateGeometry()
        if self._in_status_bar() and not self._refit_due:
            # A status bar sizes itself only when a widget is added: ask it again, after
            # the layout pass this may be called from (re-forming it inside one crashes).
            self._refit_due = True
            QTimer.singleShot(0, self, self._refit)

    def _refit(self) -> None:
        self._refit_due = False
        bar = self.parentWidget()
        if isinstance(bar, QStatusBar) and self.sizeHint().height() != self.height():
            bar.reformat()

    # A status bar sizes its widgets by the height they want at their narrowest: there, the
    # note says instead how tall it is at the width it has (and re-asks when that changes).
    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt's name
        return not self._in_status_bar() and super().hasHeightForWidth()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        hint = super().sizeHint()
        if self._in_status_bar() and self.width() > hint.width():
            return QSize(hint.width(), self.layout().totalHeightForWidth(self.width()))
        return hint

    def _in_status_bar(self) -> bool:
        return isinstance(self.parentWidget(), QStatusBar)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._fit()  # the height that fits the new width
