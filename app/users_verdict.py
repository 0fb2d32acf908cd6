"""For how many people: a spin box for the number asking at once and the planner's verdict,
replicas of the model or one instance (POST /shoal/plan with "users"). The verdict is about
the whole cluster, not the layout the placement view shows, so it is asked on its own and
only when the model, context, KV bits or the count change."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSpinBox, QWidget

from app import theme
from app.common import buddy, message_of
from app.tasks import Tasks
from engine.client import NodeClient
from engine.cluster_records import PlanInfo
from engine.placement.users import MAX_USERS

DEBOUNCE_MS = 200  # typing "16" asks once, not for 1 and then 16


class UsersVerdict(QWidget):
    def __init__(self, client: NodeClient, tasks: Tasks, parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.tasks = client, tasks
        self.spin = QSpinBox()
        self.spin.setRange(1, MAX_USERS)
        self.spin.setValue(1)
        self.spin.setAccessibleName("People at once")
        self.spin.setToolTip("How many people ask at once: the planner compares copies of "
                             "the model (replicas) against one instance over the machines")
        self.label = QLabel()
        self.label.setObjectName("usersVerdict")
        self.label.setWordWrap(True)
        theme.set_role(self.label, "muted")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(buddy("&People at once:", self.spin))
        row.addWidget(self.spin)
        row.addWidget(self.label, 1)
        self._debounce = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self._debounce.timeout.connect(self._send)
        self.spin.valueChanged.connect(lambda _n: self._debounce.start())
        self._topic: tuple[str, int | None, int | None] | None = None  # model, context, kv
        self._asked: tuple[Any, ...] | None = None
        self._seq = 0
        self.answer: dict[str, Any] | None = None  # the row shown, as the node sent it

    @property
    def users(self) -> int:
        return self.spin.value()

    def ask(self, model: str, context: int | None, kv_bits: int | None) -> None:
        """Compare for this model at this context (None: the planner's default)."""
        self._topic = (model, context, kv_bits)
        self._send()

    def _send(self) -> None:
        if self._topic is None or not self._topic[0]:
            return
        question = (*self._topic, self.users)
        if question == self._asked:
            return  # the same question: the answer shown still holds
        self._asked = question
        self._seq += 1
        seq = self._seq
        model, context, kv_bits = self._topic
        self.label.setText(f"Comparing for {self._people()}…")
        self.tasks.run(self.client.plan, model, context, kv_bits=kv_bits, users=self.users,
                       on_done=lambda r: self._answered(seq, r, None),
                       on_error=lambda e: self._answered(seq, None, e), owner=self)

    def _answered(self, seq: int, report: PlanInfo | None,
                  error: BaseException | None) -> None:
        if seq != self._seq:
            return  # a newer question is on its way
        rows = ((report.users or {}).get("rows") or []) if report is not None else []
        self.answer = rows[0] if rows else None
        if error is not None:
            self._asked = None  # ask again next time, the node may answer then
            self.label.setText(f"Couldn't compare replicas for {self._people()}: "
                               f"{message_of(error)}")
        elif self.answer is None:
            self.label.setText(f"Nothing fits to serve {self._people()} on these machines.")
        else:
            self.label.setText(f"For {self._people()}: {self.answer['verdict']}")

    def _people(self) -> str:
        return "1 person" if self.users == 1 else f"{self.users} people"
