"""The page shown while Shoal starts: its steps (start the node, prepare the default model,
load it) with the progress the node reports, or why the node didn't start, with the end
of its log and Try again."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QGridLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import theme

STEPS = (("node", "Start the local node"), ("prepare", "Prepare the model"),
         ("load", "Load the model"))
MARKS = {"done": "✓", "now": "›", "later": "·", "failed": "✗"}


class Step(QWidget):
    def __init__(self, title: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = title
        self.state = "later"
        self.mark = QLabel(MARKS["later"])
        self.mark.setFixedWidth(18)
        self.label = QLabel(title)
        self.detail = QLabel()
        theme.set_role(self.detail, "muted")
        self.bar = QProgressBar()
        self.bar.setAccessibleName(f"{title}: progress")
        self.bar.setMaximumWidth(320)
        self.bar.hide()
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 2, 0, 2)
        grid.addWidget(self.mark, 0, 0)
        grid.addWidget(self.label, 0, 1)
        grid.addWidget(self.detail, 1, 1)
        grid.addWidget(self.bar, 2, 1)
        grid.setColumnStretch(1, 1)

    def show_state(self, state: str, detail: str = "", done: int | None = None,
                   total: int | None = None) -> None:
        """state: later, now, done or failed; a bar when `now` (busy when total is 0)."""
        self.state = state
        self.mark.setText(MARKS[state])
        role = {"done": "step-done", "now": "step-now", "failed": "error"}.get(state,
                                                                                "step-later")
        theme.set_role(self.label, role)
        theme.set_role(self.mark, role)
        self.detail.setText(detail)
        self.detail.setVisible(bool(detail))
        self.bar.setVisible(state == "now" and done is not None)
        if done is not None:
            self.bar.setRange(0, total or 0)  # 0..0 is Qt's busy bar
            self.bar.setValue(done if total else 0)
        self.setAccessibleName(f"{self.title}: {state}" + (f", {detail}" if detail else ""))


class StartPage(QWidget):
    """Start-up steps with progress, or why the node didn't start with its log."""

    retry_requested = Signal()
    skip_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        self.title = QLabel("Starting node…")
        theme.set_role(self.title, "title")
        self.title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.steps = {key: Step(text) for key, text in STEPS}
        steps = QWidget()
        steps.setMaximumWidth(460)
        sv = QVBoxLayout(steps)
        for step in self.steps.values():
            sv.addWidget(step)
        self.reason = QLabel()
        self.reason.setWordWrap(True)
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setAccessibleName("The node's log")
        self.log_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.retry_button = QPushButton("Try again")
        self.retry_button.clicked.connect(self.retry_requested)
        self.skip_button = QPushButton("Open Shoal now")
        self.skip_button.setToolTip("Use the other views while the model gets ready")
        self.skip_button.clicked.connect(self.skip_requested)
        layout.addStretch(1)
        layout.addWidget(self.title)
        layout.addWidget(steps, 0, Qt.AlignmentFlag.AlignHCenter)
        for w in (self.reason, self.log_view):
            layout.addWidget(w)
        for w in (self.retry_button, self.skip_button):
            layout.addWidget(w, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addStretch(1)
        self.show_starting()

    def show_starting(self) -> None:
        self.title.setText("Starting node…")
        self.steps["node"].show_state("now", "", 0, 0)
        for key in ("prepare", "load"):
            self.steps[key].show_state("later")
        for w in (self.reason, self.log_view, self.retry_button, self.skip_button):
            w.hide()

    def follow(self, status: dict[str, Any]) -> bool:
        """Show the node's start-up from its status; True once there is nothing left to
        wait for (the model is ready, or no model is set to load)."""
        runner = status.get("runner") or {}
        kind = runner.get("type")
        if status.get("state") in ("starting", "unreachable", None):
            return False
        if not kind:  # a node too old to say: nothing to wait for
            return True
        self.steps["node"].show_state("done")
        model = runner.get("model") or status.get("model") or "the model"
        if kind == "Preparing":
            done, total = int(runner.get("done") or 0), int(runner.get("total") or 0)
            step = str(runner.get("step") or "preparing")
            detail = f"{step[:1].upper()}{step[1:]}" + (
                f": {100 * done // total}%" if total else "")
            self.title.setText(f"Getting {model} ready…")
            self.steps["prepare"].show_state("now", detail, done, total)
            self.steps["load"].show_state("later")
            self.skip_button.show()
            return False
        self.steps["prepare"].show_state("done")
        if kind == "Loading":
            done, total = runner.get("layers_done") or 0, runner.get("layers_total") or 0
            self.title.setText(f"Loading {model}…")
            self.steps["load"].show_state(
                "now", f"{done}/{total} layers" if total else "Starting the worker",
                done, total)
            self.skip_button.show()
            return False
        if kind == "Failed":
            self.steps["load"].show_state("failed", str(runner.get("reason") or ""))
        else:
            self.steps["load"].show_state("done")
        return True

    def show_failure(self, reason: str, log_tail: str, log_path: str) -> None:
        self.title.setText("The local node didn't start")
        self.steps["node"].show_state("failed")
        self.reason.setText(f"{reason}\nIts output is in {log_path}; the end of it is below.")
        self.log_view.setPlainText(log_tail or "(the node wrote nothing)")
        for w in (self.reason, self.log_view, self.retry_button):
            w.show()
        self.skip_button.hide()
