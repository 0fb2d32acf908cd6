"""The KV cache's bits in the placement view: what the plan and the launch use (16, 8 or
4; or the node's setting), and, where a placement runs out of memory at 16 bits, the
offer of fewer ("It fits 128K with 8-bit KV cache") once the planner says one fits."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QWidget

from app import theme
from app.tasks import Tasks
from engine.client import NodeClient
from engine.placement.memory import context_label

CHOICES = ((None, "Default"), (16, "16-bit"), (8, "8-bit"), (4, "4-bit"))


class KVBox(QComboBox):
    """The bits chosen (None: the node's setting, which the plan's answer names)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        for bits, text in CHOICES:
            self.addItem(text, bits)
        self.setAccessibleName("KV cache bits")
        self.setToolTip("Bits each value of the KV cache is kept in: 8 holds about 1.9x "
                        "the context in the same memory, 4 about 3.6x, at some cost in "
                        "quality (docs/benchmarks.md)")

    @property
    def bits(self) -> int | None:
        return self.currentData()

    def set_default(self, bits: int) -> None:
        """Name what "Default" means on this node (its --kv-bits)."""
        self.setItemText(0, f"Default ({bits}-bit)")

    def choose(self, bits: int) -> None:
        self.setCurrentIndex(max(self.findData(bits), 0))


class KVOffer(QWidget):
    """Where a placement doesn't fit at 16 bits, ask the planner for the same one at 8,
    then 4 bits, and offer the first that fits; `chosen` carries its bits."""

    chosen = Signal(int)

    def __init__(self, client: NodeClient, tasks: Tasks, parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.tasks = client, tasks
        self.bits = 0  # what the offer's button chooses
        self._asked = 0  # the newest question: older answers are dropped
        self.text = QLabel()
        self.text.setWordWrap(True)
        theme.set_role(self.text, "strong")
        self.button = QPushButton()
        self.button.clicked.connect(lambda: self.chosen.emit(self.bits))
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.text, 1)
        row.addWidget(self.button)
        self.hide()

    def clear(self) -> None:
        self._asked += 1
        self.hide()

    def probe(self, body: dict[str, Any], context: int) -> None:
        """`body` (a plan request) ran out of memory at 16 bits: try 8, then 4."""
        self.clear()
        asked = self._asked
        self._try(body, context, (8, 4), asked)

    def _try(self, body: dict[str, Any], context: int, left: tuple[int, ...],
             asked: int) -> None:
        if not left or asked != self._asked:
            return
        bits = left[0]

        def fits(_report: Any) -> None:
            if asked != self._asked:
                return
            self.bits = bits
            self.text.setText(f"It fits {context_label(context)} context with {bits}-bit "
                              f"KV cache.")
            self.button.setText(f"Use {bits}-bit KV")
            self.button.setAccessibleName(f"Plan and launch with {bits}-bit KV cache")
            self.show()

        self.tasks.run(self.client.plan, body["model"], body.get("context"),
                       body.get("strategy"), body.get("nodes"), body.get("backend"),
                       kv_bits=bits, on_done=fits,
                       on_error=lambda _e: self._try(body, context, left[1:], asked),
                       owner=self)
