"""Keep the app's own node alive: notice when it stops (it exited, or stopped answering),
start it again with the reason in one line, and stop trying after three stops in a minute
(a node that keeps dying would otherwise restart forever and hide why).

A node the app didn't start belongs to someone else: it is never restarted; the app says
it is gone and waits for Try again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.common import message_of
from app.node import LocalNode
from app.tasks import Tasks

log = logging.getLogger(__name__)

ENGINE = "Shoal's engine"  # what the user calls the node the app starts


class Restarts:
    """How many stops in the last `window` seconds; allows a restart until `limit`."""

    def __init__(self, limit: int = 3, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.limit, self.window, self.clock = limit, window, clock
        self.times: deque[float] = deque()

    def record(self) -> bool:
        """Count a stop now; True while another restart is allowed."""
        now = self.clock()
        self.times.append(now)
        while self.times and now - self.times[0] > self.window:
            self.times.popleft()
        return len(self.times) < self.limit

    def clear(self) -> None:
        self.times.clear()


class NodeKeeper(QObject):
    """Watches the LocalNode off the GUI thread and restarts it when it stops.

    restarting(sentence): it stopped, and is being started again.
    back(): it answers again (after a restart or a Try again).
    gave_up(sentence): it stopped too often, or couldn't be started: Try again is the user's.
    lost(sentence): a node we didn't start went away; it is not ours to restart.
    """

    restarting = Signal(str)
    back = Signal()
    gave_up = Signal(str)
    lost = Signal(str)

    def __init__(self, node: LocalNode, tasks: Tasks, restarts: Restarts | None = None,
                 hang_after: float = 5.0, parent: QObject | None = None):
        super().__init__(parent)
        self.node, self.tasks = node, tasks
        self.restarts = restarts or Restarts()
        self.hang_after = hang_after
        self.busy = False  # restarting now
        self._stop: threading.Event | None = None
        self._closed = False

    @property
    def watching(self) -> bool:
        return self._stop is not None

    def watch(self) -> None:
        """Start watching the node (once it answers); a second call changes nothing."""
        if self._closed or self._stop is not None:
            return
        stop = self._stop = threading.Event()
        self.tasks.run(self.node.watch, stop, self.hang_after,
                       on_done=lambda how: self._ended(stop, how),
                       on_error=lambda e: self._ended(stop, f"unwatchable: {e}"))

    def close(self) -> None:
        """Stop watching for good (at quit, or before a restart the user asked for)."""
        self._closed = True
        self._unwatch()

    def _unwatch(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def _ended(self, stop: threading.Event, how: str | None) -> None:
        if stop.is_set() or self._closed:
            return  # we stopped watching on purpose
        self._stop = None
        if not self.node.started_by_us:
            self.lost.emit("The Shoal node that was running on this machine, which Shoal "
                           "didn't start, stopped answering. Shoal leaves another program's "
                           "node alone: start it again, or choose Try again and Shoal starts "
                           "its own.")
            return
        log.warning("The local node stopped (%s)", how)
        sentence = f"{ENGINE} stopped unexpectedly ({how})"
        if not self.restarts.record():
            self.gave_up.emit(f"{ENGINE} stopped {self.restarts.limit} times within a "
                              f"minute (the last time: {how}), so Shoal stopped starting it "
                              "again. Its log may say why; Try again starts it once more.")
            return
        self._restart(sentence)

    def _restart(self, sentence: str) -> None:
        self.busy = True
        self.restarting.emit(f"{sentence}; starting it again…")
        self.tasks.run(self.node.restart, f"restarted by the app: {sentence}",
                       on_done=lambda _n: self._started(),
                       on_error=lambda e: self._start_failed(sentence, e))

    def _started(self) -> None:
        self.busy = False
        if self._closed:
            return
        self.back.emit()
        self.watch()

    def _start_failed(self, sentence: str, error: BaseException) -> None:
        self.busy = False
        if self._closed:
            return
        log.warning("Starting the local node again failed: %s", message_of(error))
        if self.restarts.record():
            self._restart(f"{ENGINE} didn't start again ({message_of(error)})")
            return
        self.gave_up.emit(f"{sentence}, and starting it again failed: {message_of(error)} "
                          "Shoal stopped trying; its log may say why, and Try again starts "
                          "it once more.")

    def restart_now(self, why: str, to: tuple[str, int, str | None] | None = None) -> None:
        """The user asked (Settings → Restart now): stop the node we started and start
        it again, not counted as a crash; `to`: new (host, port, api_key)."""
        self._by_hand(f"Restarting {ENGINE} {why}…", f"restarted by the user {why}",
                      polite=True, to=to)

    def _manual_failed(self, error: BaseException) -> None:
        self.busy = False
        if not self._closed:
            self.gave_up.emit(f"{ENGINE} didn't start again: {message_of(error)} Its log "
                              "may say why; Try again starts it once more.")

    def try_again(self) -> None:
        """After gave_up or lost: start (or find) the node once more, counting afresh."""
        if not (self.busy or self._closed):
            self.restarts.clear()
        self._by_hand(f"Starting {ENGINE}…", "started again by the user")

    def _by_hand(self, sentence: str, note: str, **how: object) -> None:
        """A start the user asked for (not counted as a crash): `note` goes in its log."""
        if self.busy or self._closed:
            return
        self._unwatch()
        self.busy = True
        self.restarting.emit(sentence)
        self.tasks.run(self.node.restart, note, **how, on_done=lambda _n: self._started(),
                       on_error=lambda e: self._manual_failed(e))
