"""The Developer panel: how other programs reach this node. The live API address, model id
and key state with Copy buttons; ready settings for the coding agents and chat UIs the
README covers (the agents' text is engine.connect's, what `shoal connect` prints); and a
log of recent requests: the node's own (GET /shoal/requests, every client, a refusal's
reason) where engine.client can read it, else the requests this app made."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.codeblock import CopyButton
from app.common import buddy
from app.error_note import ErrorNote
from app.sentences import explain
from engine.records import RequestInfo

AGENTS = (("claude", "Claude Code"), ("codex", "Codex CLI"), ("opencode", "OpenCode"),
          ("continue", "Continue"), ("openwebui", "Open WebUI"), ("curl", "curl"))
LOG_ROWS = 200
DEFAULT_CONTEXT = 8192  # until the node says the loaded model's
LOG_EVERY_S = 2.0


def node_log_readable() -> bool:
    """Can engine.client read the node's request log? (Older clients can't: the panel
    then shows the requests this app made.)"""
    from engine.client import NodeClient
    return callable(getattr(NodeClient, "requests", None))


def node_record(e: RequestInfo) -> dict[str, Any]:
    """A /shoal/requests entry as a row of the log: a refusal's reason in a person's
    words, the node's own kept as its detail."""
    outcome, detail = ("answered" if e.status < 400 else "refused"), ""
    if e.reason:
        explained = explain(e.reason)
        outcome, detail = explained.sentence, explained.detail
    return {"at": e.at, "client": e.client, "route": f"{e.method} {e.path}".strip(),
            "status": str(e.status or ""), "ok": e.status < 400, "outcome": outcome,
            "detail": detail, "seconds": e.seconds}


def settings_text(agent: str, url: str, model: str, context: int, needs_key: bool) -> str:
    """The settings to paste for `agent` (a key of AGENTS)."""
    from engine.connect import AGENTS as CONNECT
    from engine.connect import Target, render
    if agent in CONNECT:
        return render(agent, Target(url, model, context, needs_key))
    key = "KEY" if needs_key else "shoal"
    if agent == "openwebui":
        return ("# Open WebUI: Admin Panel → Settings → Connections\n"
                f"# OpenAI API: URL {url}/v1, key {key}\n"
                f"# or Ollama API: URL {url}\n"
                "# From Docker, use http://host.docker.internal instead of 127.0.0.1, and "
                "start the node on 0.0.0.0 with an API key (Settings → API).\n")
    auth = ' -H "Authorization: Bearer $SHOAL_API_KEY"' if needs_key else ""
    return (f"curl {url}/v1/chat/completions{auth} -H 'Content-Type: application/json' \\\n"
            f"  -d '{{\"model\": \"{model}\", \"messages\": "
            "[{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": true}'\n")


def _copy_row(field: QWidget, what: str) -> QHBoxLayout:
    row = QHBoxLayout()
    row.addWidget(field, 1)
    row.addWidget(CopyButton(lambda: field.text(), what))
    return row


class DeveloperPanel(QWidget):
    def __init__(self, url: str, api_key: str | None, logs_dir: Path | None = None,
                 tasks: Any = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.url, self.api_key = url.rstrip("/"), api_key
        self.logs_dir = logs_dir
        self.poller = None
        if tasks is not None and node_log_readable():
            from app.polling import Poller
            self.poller = Poller(tasks, self.url, lambda c: c.requests(), LOG_EVERY_S,
                                 api_key=api_key, parent=self)
            self.poller.updated.connect(self._node_log)
        self.model, self.context = "", DEFAULT_CONTEXT
        self.requests: deque[dict[str, Any]] = deque(maxlen=LOG_ROWS)
        self.address = self._field(f"{self.url}/v1", "API address")
        self.model_field = self._field("", "Model id")
        self.model_field.setPlaceholderText("no model loaded")
        self.key_state = QLabel()
        self.key_state.setWordWrap(True)
        self.key_state.setObjectName("keyState")
        self.agent_box = QComboBox()
        self.agent_box.setAccessibleName("Agent or chat UI")
        for key, text in AGENTS:
            self.agent_box.addItem(text, key)
        self.agent_box.currentIndexChanged.connect(lambda _i: self.refresh())
        self.snippet = QPlainTextEdit()
        self.snippet.setReadOnly(True)
        self.snippet.setTabChangesFocus(True)
        self.snippet.setAccessibleName("Settings to paste")
        self.snippet.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.snippet.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.copy_snippet = CopyButton(self.snippet.toPlainText, "the settings")
        self.log_table = QTableWidget(0, 5)
        self.log_table.setAccessibleName("Requests")
        self.log_table.setHorizontalHeaderLabels(["Time", "Client", "Request", "Status",
                                                  "Outcome"])
        header = self.log_table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        self.log_table.verticalHeader().hide()
        self.log_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.log_table.currentCellChanged.connect(lambda row, *_: self._show_failure(row))
        self.failure = ErrorNote()  # the chosen failed request's reason, details a click away
        self.failure.hide()
        note = QLabel("Every client's requests to the node, with the reason of each one "
                      "it refused." if self.poller is not None else
                      "Requests made from this app. Other clients' requests, and every "
                      "refused one with its reason, are in the node's log.")
        note.setWordWrap(True)
        theme.set_role(note, "muted")
        self.log_button = QPushButton("Show the node's log")
        self.log_button.setEnabled(logs_dir is not None)
        self.log_button.clicked.connect(self.show_log)
        self.log_dialog = None

        form = QFormLayout()
        form.addRow(buddy("API &address:", self.address), _copy_row(self.address,
                                                                           "the API address"))
        form.addRow(buddy("Model &id:", self.model_field), _copy_row(self.model_field,
                                                                            "the model id"))
        form.addRow("API key:", self.key_state)
        agent_row = QHBoxLayout()
        agent_row.addWidget(self.agent_box)
        agent_row.addStretch(1)
        agent_row.addWidget(self.copy_snippet)
        form.addRow(buddy("&Settings for:", self.agent_box), agent_row)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.snippet, 2)
        head = QHBoxLayout()
        heading = QLabel("Requests")
        theme.set_role(heading, "section")
        head.addWidget(heading)
        head.addStretch(1)
        head.addWidget(self.log_button)
        layout.addLayout(head)
        layout.addWidget(note)
        layout.addWidget(self.log_table, 1)
        layout.addWidget(self.failure)
        self.refresh()

    @staticmethod
    def _field(text: str, name: str) -> QLineEdit:
        edit = QLineEdit(text)
        edit.setReadOnly(True)
        edit.setAccessibleName(name)
        return edit

    def set_node_status(self, status: dict[str, Any]) -> None:
        """Follow the node: the model it has loaded and that model's context."""
        runner = status.get("runner") or {}
        model = str(runner.get("model") or status.get("model") or "")
        context = int(runner.get("context_length") or 0) or self.context
        if (model, context) != (self.model, self.context):
            self.model, self.context = model, context
            self.refresh()

    def retarget(self, url: str, api_key: str | None) -> None:
        """The node serves at `url` with `api_key` now (Settings → API, Restart now)."""
        self.url, self.api_key = url.rstrip("/"), api_key
        self.address.setText(f"{self.url}/v1")
        if self.poller is not None:
            self.poller.retarget(self.url, api_key)
        self.refresh()

    def refresh(self) -> None:
        self.model_field.setText(self.model)
        if self.api_key:
            self.key_state.setText("Required: clients send it as a Bearer token. The agents' "
                                   "settings read it from SHOAL_API_KEY; it is kept in the "
                                   "keyring (Settings → API).")
        else:
            self.key_state.setText("None: the API answers only on this machine. To serve "
                                   "other machines, set a key and an address in "
                                   "Settings → API.")
        agent = self.agent_box.currentData()
        self.snippet.setPlainText(settings_text(agent, self.url, self.model or "MODEL",
                                                self.context, bool(self.api_key)))

    def showEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt's name
        super().showEvent(event)
        if self.poller is not None:
            self.poller.start()

    def hideEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt's name
        super().hideEvent(event)
        if self.poller is not None:
            self.poller.stop()

    def add_request(self, record: dict[str, Any]) -> None:
        """One request the app made (ChatPane.request_done), newest first. The node's
        own log has those that reached it; one that never got there is only here."""
        if self.poller is None or not record.get("reached", True):
            self.requests.appendleft(record)
            self._row(record)

    def _node_log(self, found: list[RequestInfo]) -> None:
        newest = [node_record(e) for e in found][-LOG_ROWS:]
        known = self.requests[0]["at"] if self.requests else 0.0
        for record in newest:
            if (record.get("at") or 0) > known:
                self.requests.appendleft(record)
                self._row(record)

    def _row(self, record: dict[str, Any]) -> None:
        t = self.log_table
        t.insertRow(0)
        seconds = record.get("seconds")
        outcome = str(record.get("outcome") or "")
        if seconds is not None:
            outcome += f" · {seconds:.1f} s"
        status = record.get("status") or ("ok" if record.get("ok", True) else "failed")
        cells = [time.strftime("%H:%M:%S", time.localtime(record.get("at") or time.time())),
                 str(record.get("client") or ""), str(record.get("route") or ""),
                 str(status), outcome]
        for j, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if j == 4 and not record.get("ok", True):
                item.setForeground(theme.colour("error"))
                item.setToolTip(str(record.get("outcome") or ""))
                item.setData(Qt.ItemDataRole.UserRole, str(record.get("detail") or ""))
            t.setItem(0, j, item)
        while t.rowCount() > LOG_ROWS:
            t.removeRow(t.rowCount() - 1)

    def _show_failure(self, row: int) -> None:
        """The chosen request, if it failed: its reason, with the node's words behind
        Details."""
        item = self.log_table.item(row, 4) if row >= 0 else None
        detail = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        if detail is None:
            self.failure.hide()
            return
        when = self.log_table.item(row, 0).text()
        self.failure.set_text(f"At {when}: {item.toolTip()}", detail)
        self.failure.show()

    def show_log(self) -> None:
        if self.logs_dir is None:
            return
        from app.logs import LogDialog
        self.log_dialog = LogDialog(self.logs_dir / "node.log", self)
        self.log_dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.log_dialog.show()
