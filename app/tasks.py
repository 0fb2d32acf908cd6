"""The one helper for work off the GUI thread.

`Tasks.run` calls a function on a worker thread and delivers its result (or exception) to a
callback on the GUI thread. `Tasks.stream` iterates something blocking (a chat stream, a
status poll) on a worker thread and hands the items to the GUI thread in batches, at most
one batch per `interval_ms`, so a fast token stream costs one repaint per batch.

Workers never hold a Qt object of a task: they report through one long-lived dispatcher
by number, and the GUI thread owns (and so destroys) everything else. A QObject whose last
Python reference dies on a worker thread is destroyed there, which crashes Qt.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import shiboken6
from PySide6.QtCore import QObject, QRunnable, QThreadPool, QTimer, Signal, Slot

log = logging.getLogger(__name__)

Callback = Callable[..., Any] | None


def _call(fn: Callback, *args: Any) -> None:
    """Run a user callback; an exception there is logged, never lets the app fall over."""
    if fn is None:
        return
    try:
        fn(*args)
    except Exception:
        log.exception("Callback %r failed", fn)


class _Dispatcher(QObject):
    """Lives on the GUI thread (a child of Tasks); workers emit to it, queued."""

    finished = Signal(int, object, object)  # (job number, result, exception)


class _Job(QRunnable):
    """Runs fn on a worker and reports the outcome by job number."""

    def __init__(self, fn: Callable[[], Any], key: int, dispatcher: _Dispatcher):
        super().__init__()
        self._fn, self._key, self._signal = fn, key, dispatcher.finished

    def run(self) -> None:
        fn, self._fn = self._fn, None
        try:
            result, error = fn(), None
        except Exception as e:  # noqa: BLE001 - every failure goes to the callback
            result, error = None, e
        del fn
        self._signal.emit(self._key, result, error)


def _gone(owner: QObject | None) -> bool:
    return owner is not None and not shiboken6.isValid(owner)


class _Call:
    """A pending Tasks.run: its callbacks, until the result is delivered."""

    def __init__(self, on_done: Callback, on_error: Callback, owner: QObject | None):
        self.on_done, self.on_error, self.owner = on_done, on_error, owner

    def finish(self, result: Any, error: BaseException | None) -> None:
        if _gone(self.owner):
            return  # the widget that asked was closed meanwhile
        if error is None:
            _call(self.on_done, result)
        elif self.on_error is not None:
            _call(self.on_error, error)
        else:
            log.error("Background task failed", exc_info=error)


class _Feed:
    """What a stream's worker and the GUI thread share: plain Python, no Qt."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.lock = threading.Lock()
        self.buffer: list[Any] = []

    def push(self, item: Any) -> None:  # worker thread
        with self.lock:
            self.buffer.append(item)

    def take(self) -> list[Any]:
        with self.lock:
            items, self.buffer = self.buffer, []
        return items


class StreamTask(QObject):
    """Handle of a running stream. cancel() is immediate for the GUI (no more items are
    delivered, on_done still comes once); the worker notices at its next item and closes
    the source, since closing a socket from another thread does not wake a blocked read."""

    def __init__(self, on_items: Callback, on_done: Callback, on_error: Callback,
                 interval_ms: int, owner: QObject | None = None):
        super().__init__()
        self.owner = owner
        self._feed = _Feed()
        self.cancelled = self._feed.cancelled
        self._callbacks = (on_items, on_done, on_error)
        self.done = False
        self._timer = QTimer(self, interval=interval_ms)
        self._timer.timeout.connect(self._flush)

    def cancel(self) -> None:
        self.cancelled.set()

    @Slot()
    def _flush(self) -> None:
        items = self._feed.take()
        if _gone(self.owner):
            self.cancel()
        elif items and not self.cancelled.is_set():
            _call(self._callbacks[0], items)

    def finish(self, _result: Any, error: BaseException | None) -> None:
        self._timer.stop()
        self._flush()
        self.done = True
        _, on_done, on_error = self._callbacks
        self._callbacks = (None, None, None)  # no closures kept alive past the stream
        if _gone(self.owner):
            return
        if error is not None and not self.cancelled.is_set():
            if on_error is not None:
                _call(on_error, error)
            else:
                log.error("Background stream failed", exc_info=error)
        else:
            _call(on_done)


class Tasks(QObject):
    """Owns the worker threads. Create one per application, on the GUI thread."""

    def __init__(self, parent: QObject | None = None, max_threads: int = 8):
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(max_threads)
        self._dispatcher = _Dispatcher(self)
        self._dispatcher.finished.connect(self._finished)
        self._keys = itertools.count()
        self._live: dict[int, _Call | StreamTask] = {}  # until their outcome is delivered

    @Slot(int, object, object)
    def _finished(self, key: int, result: Any, error: BaseException | None) -> None:
        job = self._live.pop(key, None)
        if job is not None:
            job.finish(result, error)

    def run(self, fn: Callable[..., Any], *args: Any, on_done: Callback = None,
            on_error: Callback = None, owner: QObject | None = None, **kwargs: Any) -> None:
        """Call fn(*args, **kwargs) on a worker; on_done(result) or on_error(exc) follows
        on the GUI thread, unless `owner` (the widget asking) was deleted meanwhile.
        Without on_error, failures are logged."""
        key = next(self._keys)
        self._live[key] = _Call(on_done, on_error, owner)
        self.pool.start(_Job(lambda: fn(*args, **kwargs), key, self._dispatcher))

    def stream(self, fn: Callable[..., Iterable[Any]], *args: Any, on_items: Callback = None,
               on_done: Callback = None, on_error: Callback = None,
               interval_ms: int = 50, owner: QObject | None = None) -> StreamTask:
        """Iterate fn(*args) on a worker. on_items(list) gets batches on the GUI thread,
        then exactly one of on_done() / on_error(exc) (on_done after a cancel); nothing
        once `owner` is deleted (the stream is then cancelled)."""
        task = StreamTask(on_items, on_done, on_error, interval_ms, owner)
        key = next(self._keys)
        self._live[key] = task
        feed = task._feed

        def work() -> None:
            source = fn(*args)
            iterator = iter(source)
            try:
                for item in iterator:
                    if feed.cancelled.is_set():
                        break
                    feed.push(item)
            finally:
                # Closing here, on the reading thread, is what tells the node to stop.
                for obj in (iterator, source):
                    close = getattr(obj, "close", None)
                    if close is not None:
                        close()

        task._timer.start()
        self.pool.start(_Job(work, key, self._dispatcher))
        return task

    def wait(self, timeout_ms: int) -> bool:
        """Wait for running work (at quit). True when everything finished in time."""
        return self.pool.waitForDone(timeout_ms)

    def cancel_streams(self) -> None:
        for job in list(self._live.values()):
            if isinstance(job, StreamTask):
                job.cancel()
