"""The local node's status (state, model, version), kept fresh off the GUI thread.

Polls /shoal/status once a second rather than holding the SSE stream open: a poll is
bounded by its own timeout, so quitting never waits on a silent event stream (closing a
socket from another thread doesn't wake a blocked read).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from app import theme
from app.error_note import ErrorNote
from app.sentences import explain, remember
from app.tasks import StreamTask, Tasks
from engine.client import NodeClient
from engine.errors import ShoalError

log = logging.getLogger(__name__)

# Beyond the node's own states: "starting" (we wait for it) and "unreachable" (no answer).
STATES = ("starting", "idle", "loading", "generating", "error", "stopped", "unreachable")
BUSY = ("Preparing", "Loading")  # runner types during which a request waits for the model


def progress_of(runner: dict[str, Any]) -> tuple[int, int] | None:
    """(done, total) of a model being prepared or loaded, when the node can say."""
    kind = runner.get("type")
    if kind == "Preparing":
        done, total = runner.get("done"), runner.get("total")
    elif kind == "Loading":
        done, total = runner.get("layers_done"), runner.get("layers_total")
    else:
        return None
    return (int(done or 0), int(total)) if total else None


def runner_text(runner: dict[str, Any]) -> str | None:
    """What the node is doing before it can answer, in a few words: 'importing the
    default model (40%)', 'loading 12/30 layers'; None when it is ready or idle."""
    kind, progress = runner.get("type"), progress_of(runner)
    if kind == "Preparing":
        step = str(runner.get("step") or "preparing the model")
        return f"{step} ({100 * progress[0] // progress[1]}%)" if progress else step
    if kind == "Loading":
        return (f"loading {progress[0]}/{progress[1]} layers" if progress else
                "starting the worker")
    return None


def poll_status(url: str, stop: threading.Event, interval: float = 1.0,
                timeout: float = 2.0, api_key: str | None = None
                ) -> Iterator[dict[str, Any]]:
    """Yield the node's status whenever it changes, until `stop` is set."""
    last: dict[str, Any] | None = None
    with NodeClient(url, api_key=api_key, timeout=timeout) as client:
        while not stop.is_set():
            try:
                status = client.status().to_json()  # the app reads the snapshot's JSON
            except ShoalError as e:  # explained here, where the cause (errno) is known
                said = explain(e)
                status = {"state": "unreachable", "model": None, "error": said.sentence,
                          "error_detail": said.detail, "version": None}
            if status != last:
                last = status
                yield status
            stop.wait(interval)


class StatusMonitor(QObject):
    """Emits `changed(status)` on the GUI thread whenever the node's status changes."""

    changed = Signal(object)

    def __init__(self, tasks: Tasks, url: str, interval: float = 1.0,
                 parent: QObject | None = None, api_key: str | None = None):
        super().__init__(parent)
        self._tasks, self._url, self._interval = tasks, url, interval
        self._api_key = api_key
        self._stop = threading.Event()
        self._task: StreamTask | None = None
        self.status: dict[str, Any] = {"state": "starting"}

    def start(self) -> None:
        self._stop = threading.Event()  # the old poll, if any, keeps its own and ends
        self._task = self._tasks.stream(poll_status, self._url, self._stop, self._interval,
                                        2.0, self._api_key, on_items=self._on_items,
                                        on_error=self._on_error)

    def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()

    def retarget(self, url: str, api_key: str | None) -> None:
        """Poll the node at `url` with `api_key` from now on (its API settings changed)."""
        if (url, api_key) == (self._url, self._api_key):
            return
        running = self._task is not None and not self._stop.is_set()
        self.stop()
        self._url, self._api_key = url, api_key
        if running:
            self.start()

    def set_local(self, status: dict[str, Any]) -> None:
        """Show a state the node can't report itself (starting, or failed to start)."""
        cluster = status.get("cluster") or {}
        if cluster.get("id") and cluster.get("name"):  # errors name this machine by its name
            remember({cluster["id"]: cluster["name"]})
        self.status = in_words(status)
        self.changed.emit(self.status)

    def _on_items(self, items: list[dict[str, Any]]) -> None:
        self.set_local(items[-1])  # only the newest snapshot matters

    def _on_error(self, error: BaseException) -> None:
        log.error("Status polling stopped: %s", error)
        explained = explain(error)
        self.set_local({"state": "unreachable", "error": explained.sentence,
                        "error_detail": explained.detail})


def in_words(status: dict[str, Any]) -> dict[str, Any]:
    """`status` with its error as a sentence a person reads ("error") and the node's own
    text kept for the Details click ("error_detail")."""
    if not status.get("error") or "error_detail" in status:
        return status
    explained = explain(str(status["error"]))
    return {**status, "error": explained.sentence, "error_detail": explained.detail}


def describe(status: dict[str, Any]) -> str:
    """One line for the status bar, e.g. 'Node: generating · tiny-llama · v0.1.0'."""
    state = status.get("state") or "unknown"
    words = {"starting": "Starting node…", "unreachable": "Node not answering"}
    parts = [words.get(state, f"Node: {state}")]
    if status.get("model"):
        parts.append(str(status["model"]))
    busy = runner_text(status.get("runner") or {})
    if busy:
        parts.append(busy)
    if status.get("version"):
        parts.append(f"v{status['version']}")
    if status.get("error"):
        parts.append(str(status["error"]))
    return " · ".join(parts)


class StatusLabel(ErrorNote):
    """The status bar's text (the label named "nodeStatus"), with the technical detail of
    an error one click away; follows a StatusMonitor."""

    def __init__(self, monitor: StatusMonitor, parent: QWidget | None = None):
        super().__init__(parent, role=None)
        self.text.setObjectName("nodeStatus")
        monitor.changed.connect(self._show)
        self._show(monitor.status)

    def _show(self, status: dict[str, Any]) -> None:
        self.set_text(describe(status), str(status.get("error_detail") or ""))
        theme.set_role(self.text, "error" if status.get("error") else None)
        self.text.setToolTip(str(status.get("error") or ""))
