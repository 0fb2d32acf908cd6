"""Widgets that show a conversation: one bubble per message (markdown prose, highlighted
code blocks, a folded reasoning section, what the reply is waiting for, its figures,
Continue when it stopped early, Try again when it failed), the column they sit in, the
prompt box.

Per-message buttons are out of the Tab chain (Tab goes from the conversation to the
message box); with the conversation focused, the arrow keys walk its buttons."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from PySide6.QtCore import QEvent, QMimeData, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QKeyEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.attachments import carries_images
from app.codeblock import CodeBlock, CopyButton
from app.conversations import Conversation, Message
from app.image_strip import SENT_PX, ImageStrip
from app.markdown import split_fences, to_html, to_plain

READABLE_PX = 860  # the message column's widest: lines longer than this are hard to read
DESCRIPTION_CHARS = 600  # of a reply, for a screen reader's description

__all__ = ["CodeBlock", "MessageView", "MessageWidget", "PromptEdit", "format_stats"]


def format_stats(stats: dict[str, Any]) -> str:
    """The line under a reply, e.g. '41.2 tokens/s · first token after 6.30 s (5.1 s of it
    loading the model) · 64 tokens'. The wait is the one the user had, from Send."""
    parts = []
    if stats.get("stopped"):
        parts.append("Stopped")
    elif stats.get("finish_reason") == "length":
        parts.append("Stopped at the length limit")
    if stats.get("generation_tps") is not None:
        parts.append(f"{stats['generation_tps']:.1f} tokens/s")
    elif stats.get("_live_tps") is not None:  # still streaming: the speed so far
        parts.append(f"{stats['_live_tps']:.1f} tokens/s so far")
    wait = stats.get("wait_s", stats.get("ttft_s"))
    if wait is not None:
        text = f"first token after {wait:.2f} s"
        if stats.get("load_s"):
            load = int(min(stats["load_s"], wait) * 10) / 10  # never more than the wait
            text += f" ({load:.1f} s of it loading the model)"
        parts.append(text)
    if stats.get("completion_tokens") is not None:
        parts.append(f"{stats['completion_tokens']} tokens")
    elif stats.get("_live_tps") is not None and stats.get("_pieces"):
        parts.append(f"{stats['_pieces']} tokens so far")
    if stats.get("cached_tokens"):
        parts.append(f"{stats['cached_tokens']} tokens cached")
    if stats.get("drafted_tokens"):  # speculative decoding ran: how well it guessed
        parts.append(f"{stats.get('accepted_tokens') or 0} of {stats['drafted_tokens']} "
                     "drafted tokens kept")
    return " · ".join(parts)


class ProseLabel(QLabel):
    """Markdown prose. Links open in the browser (http and https only)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.source = ""
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.LinksAccessibleByMouse)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.linkActivated.connect(self._open)

    def set_markdown(self, text: str) -> None:
        if text != self.source:
            self.source = text
            self.setText(to_html(text))

    def plain(self) -> str:
        return to_plain(self.source)

    @staticmethod
    def _open(url: str) -> None:
        if QUrl(url).scheme() in ("http", "https"):
            QDesktopServices.openUrl(QUrl(url))

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and self.source:
            self.setText(to_html(self.source))  # link colours follow the palette


W = TypeVar("W", bound=QWidget)


def _off_tab_chain(button: W) -> W:
    """A per-message button: clicked with the mouse, reached with the arrow keys (the
    conversation's), never with Tab, and a click leaves the focus where it was."""
    button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
    return button


class MessageWidget(QFrame):
    """One message: its prose and code blocks, the reasoning folded away, the figures,
    the error if it failed (with Try again), Copy, and Continue when it stopped early
    (the length limit, or Stop)."""

    continue_requested = Signal(object)  # the Message
    retry_requested = Signal(object)  # a failed reply, to be answered again

    def __init__(self, message: Message, parent: QWidget | None = None,
                 image: Callable[[str], bytes | None] | None = None):
        super().__init__(parent)
        self.message = message
        self.streaming = False
        self.last = True  # the newest message: only it offers Continue or Try again
        self.setObjectName(f"{message.role}Message")
        theme.set_role(self, f"bubble-{'user' if message.role == 'user' else 'assistant'}")
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        who = "You" if message.role == "user" else "Assistant"
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 8)
        head = QHBoxLayout()
        self.role_label = QLabel(who)
        theme.set_role(self.role_label, "strong")
        self.copy_button = CopyButton(lambda: self.message.content,
                                      "your message" if message.role == "user" else "reply")
        self.copy_button.setAutoRaise(True)
        _off_tab_chain(self.copy_button)
        head.addWidget(self.role_label)
        head.addStretch(1)
        head.addWidget(self.copy_button)
        self.reasoning_button = QToolButton()
        self.reasoning_button.setCheckable(True)
        self.reasoning_button.setAutoRaise(True)
        self.reasoning_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.reasoning_button.setArrowType(Qt.ArrowType.RightArrow)
        self.reasoning_button.toggled.connect(self._fold)
        _off_tab_chain(self.reasoning_button)
        self.reasoning_label = QLabel()
        self.reasoning_label.setTextFormat(Qt.TextFormat.PlainText)
        self.reasoning_label.setWordWrap(True)
        self.reasoning_label.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse)
        self.reasoning_label.setAccessibleName("Reasoning")
        theme.set_role(self.reasoning_label, "reasoning")
        self.reasoning_label.hide()
        self.body = QVBoxLayout()
        self.body.setSpacing(6)
        self.segments: list[QWidget] = []  # ProseLabel for prose, CodeBlock for code
        self.pending_label = QLabel()
        theme.set_role(self.pending_label, "pending")
        self.pending_label.setWordWrap(True)
        self.pending_label.hide()
        self.stats_label = QLabel()
        self.stats_label.setObjectName("stats")
        self.stats_label.setWordWrap(True)
        theme.set_role(self.stats_label, "stats")
        self.error_label = QLabel()
        self.error_label.setObjectName("error")
        self.error_label.setWordWrap(True)
        theme.set_role(self.error_label, "error")
        self.continue_button = _off_tab_chain(QPushButton("Continue"))
        self.continue_button.setAccessibleName("Continue the reply")
        self.continue_button.clicked.connect(lambda: self.continue_requested.emit(self.message))
        self.retry_button = _off_tab_chain(QPushButton("Try again"))
        self.retry_button.setAccessibleName("Try this reply again")
        self.retry_button.setToolTip("Send the conversation again (once Shoal's node "
                                     "answers)")
        self.retry_button.clicked.connect(lambda: self.retry_requested.emit(self.message))
        foot = QHBoxLayout()
        foot.addWidget(self.stats_label, 1)
        foot.addWidget(self.continue_button)
        failed = QHBoxLayout()  # the error, and Try again beside it
        failed.addWidget(self.error_label, 1)
        failed.addWidget(self.retry_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(head)
        layout.addWidget(self.reasoning_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.reasoning_label)
        # the pictures sent with the message, read from where the conversations keep them
        self.images = ImageStrip(SENT_PX, removable=False)
        if message.images and image is not None:
            n = len(message.images)
            self.images.set_images([(image(name) or b"", f"Image {i + 1} of {n}")
                                    for i, name in enumerate(message.images)])
        layout.addWidget(self.images)
        layout.addLayout(self.body)
        layout.addWidget(self.pending_label)
        layout.addLayout(foot)
        layout.addLayout(failed)
        self.refresh()

    def text(self) -> str:
        """The text shown (prose as read, code without the fences)."""
        return "\n".join(w.plain() if isinstance(w, ProseLabel) else w.text()
                         for w in self.segments if not w.isHidden())

    def code_blocks(self) -> list[CodeBlock]:
        return [w for w in self.segments if isinstance(w, CodeBlock)]

    def buttons(self) -> list[QWidget]:
        """The message's buttons on screen, in reading order (what the arrows walk)."""
        found = [self.copy_button, self.reasoning_button,
                 *(b.copy_button for b in self.code_blocks()),
                 self.continue_button, self.retry_button]
        return [b for b in found if not b.isHidden() and b.isEnabled()]

    def set_pending(self, text: str | None) -> None:
        """What a reply without text yet is waiting for (loading, reading the prompt)."""
        self.pending_label.setText(text or "")
        self.pending_label.setVisible(bool(text))

    def set_streaming(self, on: bool) -> None:
        self.streaming = on
        self.refresh()

    def _fold(self, open_: bool) -> None:
        self.reasoning_label.setVisible(open_)
        self.reasoning_button.setArrowType(Qt.ArrowType.DownArrow if open_
                                           else Qt.ArrowType.RightArrow)

    def refresh(self) -> None:
        m = self.message
        parts = split_fences(m.content)
        # Reuse the widgets of an unchanged prefix: a streaming reply only grows at the end.
        for i, part in enumerate(parts):
            want = CodeBlock if part.kind == "code" else ProseLabel
            if i < len(self.segments) and (type(self.segments[i]) is not want or (
                    want is CodeBlock and self.segments[i].info != part.info)):
                self._drop(i)
            if i == len(self.segments):
                w = CodeBlock(part.info, self) if part.kind == "code" else ProseLabel(self)
                if isinstance(w, CodeBlock):
                    _off_tab_chain(w.copy_button)
                    w.view.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # click to select
                self.segments.append(w)
                self.body.addWidget(w)
            w = self.segments[i]
            if isinstance(w, ProseLabel):
                w.set_markdown(part.text)
            else:
                w.setText(part.text)
        self._drop(len(parts))
        if self.segments:  # an empty reply shows its pending line or error, no blank line
            self.segments[0].setVisible(bool(m.content))
        self._show_reasoning()
        stats = format_stats(m.stats)
        self.stats_label.setText(stats)
        self.stats_label.setVisible(bool(stats))
        self.error_label.setText(m.error or "")
        self.error_label.setVisible(m.error is not None)
        stopped = bool(m.stats.get("stopped"))
        offer = self.last and m.role == "assistant" and not self.streaming
        self.continue_button.setVisible(
            offer and m.error is None and bool(m.content)
            and (stopped or m.stats.get("finish_reason") == "length"))
        self.continue_button.setToolTip(
            "You stopped the reply: ask for the rest of it" if stopped else
            "The reply reached the answer length: ask for the rest of it")
        self.retry_button.setVisible(offer and m.error is not None)
        role = "Your message" if m.role == "user" else "Reply"
        if m.images:
            role += f" with {len(m.images)} image{'s' if len(m.images) > 1 else ''}"
        self.setAccessibleName(role)
        self.setAccessibleDescription(self.text()[:DESCRIPTION_CHARS])

    def _show_reasoning(self) -> None:
        text = self.message.reasoning.strip()
        self.reasoning_button.setVisible(bool(text))
        if not text:
            return
        words = len(text.split())
        thinking = self.streaming and not self.message.content
        self.reasoning_button.setText(f"Thinking… ({words} words)" if thinking
                                      else f"Reasoning ({words} words)")
        self.reasoning_button.setAccessibleName("Show the reasoning")
        self.reasoning_label.setText(text)

    def _drop(self, start: int) -> None:
        for w in self.segments[start:]:
            self.body.removeWidget(w)
            w.deleteLater()
        del self.segments[start:]


class MessageView(QScrollArea):
    """The messages of one conversation in a column of readable width; keeps the view
    pinned to the newest text."""

    continue_requested = Signal(object)  # a Message that stopped early
    retry_requested = Signal(object)  # a failed reply

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAccessibleName("Conversation")
        self.setAccessibleDescription("Up and Down reach each message's buttons (Copy, "
                                      "Continue, Try again)")
        self._inner = QWidget()
        self._column = QWidget()
        self._column.setMaximumWidth(READABLE_PX)
        self._layout = QVBoxLayout(self._column)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addStretch(1)
        self._row = QHBoxLayout(self._inner)
        self._row.addWidget(self._column)
        self.setWidget(self._inner)
        self.conversation: Conversation | None = None
        self._widgets: dict[int, MessageWidget] = {}  # id(Message) -> its widget
        self.image: Callable[[str], bytes | None] | None = None  # a kept image, by name

    def resizeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        side = max((self.viewport().width() - READABLE_PX) // 2, 6)  # centred when wide
        self._row.setContentsMargins(side, 6, side, 6)

    def show_conversation(self, conv: Conversation | None) -> None:
        for w in self._widgets.values():
            w.hide()  # at once: deletion waits for the event loop
            w.deleteLater()
        self._widgets.clear()
        self.conversation = conv
        for m in conv.messages if conv else []:
            self.add(m)

    def add(self, message: Message) -> MessageWidget:
        for older in self._widgets.values():
            if older.last:
                older.last = False
                older.refresh()
        w = MessageWidget(message, self._column, self.image)
        w.continue_requested.connect(self.continue_requested)
        w.retry_requested.connect(self.retry_requested)
        self._layout.insertWidget(self._layout.count() - 1, w)
        self._widgets[id(message)] = w
        self._scroll_to_end()
        return w

    def widget_of(self, message: Message) -> MessageWidget | None:
        return self._widgets.get(id(message))

    def refresh(self, message: Message) -> None:
        """Repaint a message if it is on screen (it may belong to another conversation)."""
        w = self._widgets.get(id(message))
        if w is not None:
            w.refresh()
            self._scroll_to_end()

    def widgets(self) -> list[MessageWidget]:
        return list(self._widgets.values())

    def buttons(self) -> list[QWidget]:
        """Every message's buttons, oldest message first."""
        return [b for w in self.widgets() for b in w.buttons()]

    # --- keyboard: Up/Down walk the buttons, Tab leaves the conversation ------------------
    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        buttons = self.buttons()
        if event.key() in (Qt.Key.Key_Up, Qt.Key.Key_Down) and buttons:
            self._focus_button(buttons[-1 if event.key() == Qt.Key.Key_Up else 0])
        else:
            super().keyPressEvent(event)

    def _focus_button(self, button: QWidget) -> None:
        if button.property("_walked") is None:  # the buttons are off the Tab chain
            button.setProperty("_walked", True)
            button.installEventFilter(self)
        button.setFocus(Qt.FocusReason.OtherFocusReason)
        self.ensureWidgetVisible(button)

    def eventFilter(self, watched: Any, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() != QEvent.Type.KeyPress or not isinstance(event, QKeyEvent):
            return False
        key, buttons = event.key(), self.buttons()
        if watched not in buttons:
            return False
        i = buttons.index(watched)
        if key in (Qt.Key.Key_Up, Qt.Key.Key_Left, Qt.Key.Key_Down, Qt.Key.Key_Right):
            step = -1 if key in (Qt.Key.Key_Up, Qt.Key.Key_Left) else 1
            self._focus_button(buttons[(i + step) % len(buttons)])
        elif key in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space):
            watched.click()
        elif key in (Qt.Key.Key_Tab, Qt.Key.Key_Backtab, Qt.Key.Key_Escape):
            self.setFocus(Qt.FocusReason.OtherFocusReason)  # back into the Tab chain here
            if key != Qt.Key.Key_Escape:
                self.focusNextPrevChild(key == Qt.Key.Key_Tab)
        else:
            return False
        return True

    def _scroll_to_end(self) -> None:
        # After the layout has grown, not before.
        QTimer.singleShot(0, self, self._pin_to_end)

    def _pin_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())


class PromptEdit(QPlainTextEdit):
    """The input box: Enter sends, Shift+Enter starts a new line, Tab moves on (a prompt
    box that keeps Tab traps keyboard users). A pasted or dropped picture or file is not
    text: images_given(mime) hands it to the chat."""

    submitted = Signal()
    images_given = Signal(object)  # the QMimeData of a paste or a drop

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setTabChangesFocus(True)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        if (event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self.submitted.emit()
        elif event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self.insertPlainText("\n")  # a plain newline, not Qt's soft line separator
        else:
            super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 - Qt's name
        return carries_images(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 - Qt's name
        if carries_images(source):
            self.images_given.emit(source)
        else:
            super().insertFromMimeData(source)
