"""Poll a node route off the GUI thread and hand each answer to the GUI thread.

A poll is bounded by its client's timeout, so stopping never waits on a silent node (the
same reason StatusMonitor polls instead of reading the event stream).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.tasks import StreamTask, Tasks
from engine.client import NodeClient
from engine.errors import ShoalError

log = logging.getLogger(__name__)

Fetch = Callable[[NodeClient], Any]


class _Schedule:
    """What the polling worker reads: plain Python (the worker holds no Qt object)."""

    def __init__(self, interval: float):
        self.interval = interval
        self.stop = threading.Event()
        self.wake = threading.Event()


def _poll(url: str, api_key: str | None, timeout: float, fetch: Fetch,
          schedule: _Schedule) -> Iterator[tuple[Any, BaseException | None]]:
    with NodeClient(url, api_key=api_key, timeout=timeout) as client:
        while not schedule.stop.is_set():
            try:
                yield fetch(client), None
            except ShoalError as e:
                yield None, e
            schedule.wake.wait(schedule.interval)
            schedule.wake.clear()


class Poller(QObject):
    """Calls fetch(client) every `interval` seconds; emits `updated(result)` or
    `failed(ShoalError)` on the GUI thread. poke() polls at once."""

    updated = Signal(object)
    failed = Signal(object)

    def __init__(self, tasks: Tasks, url: str, fetch: Fetch, interval: float,
                 api_key: str | None = None, timeout: float = 5.0,
                 parent: QObject | None = None):
        super().__init__(parent)
        self._tasks, self._url, self._fetch = tasks, url, fetch
        self._api_key, self._timeout = api_key, timeout
        self._schedule = _Schedule(interval)
        self._task: StreamTask | None = None

    @property
    def interval(self) -> float:
        return self._schedule.interval

    @interval.setter
    def interval(self, seconds: float) -> None:
        self._schedule.interval = seconds

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done

    def start(self) -> None:
        if self.running:
            return
        self._schedule = _Schedule(self._schedule.interval)
        self._task = self._tasks.stream(_poll, self._url, self._api_key, self._timeout,
                                        self._fetch, self._schedule,
                                        on_items=self._deliver, on_error=self._crashed,
                                        owner=self)

    def stop(self) -> None:
        self._schedule.stop.set()
        self._schedule.wake.set()
        if self._task is not None:
            self._task.cancel()

    def poke(self) -> None:
        self._schedule.wake.set()

    def retarget(self, url: str, api_key: str | None) -> None:
        """Poll the node at `url` with `api_key` from now on (its API settings changed)."""
        if (url, api_key) == (self._url, self._api_key):
            return
        was_running = self.running
        self.stop()
        self._task = None
        self._url, self._api_key = url, api_key
        if was_running:
            self.start()

    def _deliver(self, items: list[tuple[Any, BaseException | None]]) -> None:
        result, error = items[-1]  # only the newest answer matters
        if error is None:
            self.updated.emit(result)
        else:
            self.failed.emit(error)

    def _crashed(self, error: BaseException) -> None:
        log.error("Polling %s stopped: %s", self._url, error)
        self.failed.emit(error)
