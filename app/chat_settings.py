"""The chat pane's settings above the messages: the model (picker, what the node is doing
with it, how far a load is), the system prompt, and the sampling boxes.

The boxes edit `params`, which goes with every request; what picking a model or editing
the system prompt does is the chat pane's (app/chat.py), which connects their signals.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.common import buddy
from app.model_picker import ModelPicker
from app.status import progress_of, runner_text

NODE_DEFAULT = "node default"
DEFAULT_MAX_TOKENS = 1024  # long enough for most answers; a runaway stops, Continue goes on


class ChatSettings(QWidget):
    """Model, system prompt and sampling; `params` holds the sampling values set (a box at
    its lowest, "node default", sends none)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.params: dict[str, Any] = {}
        self.model_picker = ModelPicker()
        self.model_picker.setMinimumContentsLength(16)
        self.model_picker.setSizeAdjustPolicy(
            ModelPicker.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_picker.lineEdit().setPlaceholderText("Choose a model")
        self.model_picker.setAccessibleName("Model")
        self.model_picker.setToolTip("The model to chat with (Ctrl+L)")
        self.model_state = QLabel()
        self.model_state.setObjectName("modelState")
        theme.set_role(self.model_state, "muted")
        self.load_bar = QProgressBar()
        self.load_bar.setAccessibleName("Loading the model")
        self.load_bar.setMaximumWidth(120)
        self.load_bar.setTextVisible(False)
        self.load_bar.hide()
        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("System prompt for this conversation (optional)")
        self.system_edit.setAccessibleName("System prompt")
        self.temperature = self._sampling_box(QDoubleSpinBox(), "temperature", -0.1, 2.0, 0.1)
        self.top_p = self._sampling_box(QDoubleSpinBox(), "top_p", 0.0, 1.0, 0.05)
        self.max_tokens = self._sampling_box(QSpinBox(), "max_tokens", 0, 32768, 256)
        self.max_tokens.setValue(DEFAULT_MAX_TOKENS)  # a bounded answer; Continue for more
        self.max_tokens.setToolTip("The longest answer, in tokens; a reply that reaches it "
                                   "offers Continue")

        rows = QVBoxLayout(self)
        rows.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(buddy("&Model:", self.model_picker))
        top.addWidget(self.model_picker, 1)
        top.addWidget(self.model_state)
        top.addWidget(self.load_bar)
        rows.addLayout(top)
        rows.addWidget(self.system_edit)
        sampling = QHBoxLayout()
        for text, box in (("&Temperature:", self.temperature), ("Top &p:", self.top_p),
                          ("Max t&okens:", self.max_tokens)):
            sampling.addWidget(buddy(text, box))
            sampling.addWidget(box)
        sampling.addStretch(1)
        rows.addLayout(sampling)

    def _sampling_box(self, box: QSpinBox | QDoubleSpinBox, key: str, low: float,
                      high: float, step: float) -> QSpinBox | QDoubleSpinBox:
        """A box for one sampling parameter; its lowest value means "the node's default"
        (the parameter is then not sent)."""
        box.setRange(low, high)
        box.setSingleStep(step)
        box.setSpecialValueText(NODE_DEFAULT)
        box.setValue(low)
        box.setObjectName(key)
        box.setAccessibleName(key.replace("_", " "))

        def changed(value: float) -> None:
            if value == box.minimum():
                self.params.pop(key, None)
            else:
                self.params[key] = value
        box.valueChanged.connect(changed)
        return box

    def show_status(self, status: dict[str, Any]) -> None:
        """The node's model (unless one is being typed), and what it is doing with it."""
        model = status.get("model")
        if model and not self.model_picker.lineEdit().hasFocus():
            self.model_picker.setCurrentText(str(model))
        self.model_picker.set_status(status)
        runner = status.get("runner") or {}
        busy = runner_text(runner)
        self.model_state.setText(busy[:1].upper() + busy[1:] + "…" if busy else "")
        self.model_state.setVisible(bool(busy))
        progress = progress_of(runner)
        self.load_bar.setVisible(progress is not None)
        if progress is not None:
            self.load_bar.setRange(0, progress[1])
            self.load_bar.setValue(progress[0])

    def focus_model_picker(self) -> None:
        """Straight to the model list, its text selected and the list open."""
        self.model_picker.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.model_picker.lineEdit().selectAll()
        if self.model_picker.count():
            self.model_picker.showPopup()
