"""The one helper for work off the GUI thread.

`Tasks.run` calls a function on a worker thread and delivers its result (or exception) to a
callback on the GUI thread. `Tasks.stream` iterates something blocking (a chat stream, a
status poll) on a worker thread and hands the items to the GUI thread in batches, at most
one batch per `interval_ms`, so a fast token stream costs one repaint per batch.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

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


class _Relay(QObject):
    """Lives on the GUI thread; signals emitted by a worker are queued to it."""

    finished = Signal(object, object)  # (result, exception)

    def __init__(self, on_done: Callback, on_error: Callback, release: Callable):
        super().__init__()
        self._on_done, self._on_error, self._release = on_done, on_error, release
        self.finished.connect(self._deliver)

    @Slot(object, object)
    def _deliver(self, result: Any, error: BaseException | None) -> None:
        self._release(self)
        if error is None:
            _call(self._on_done, result)
        elif self._on_error is not None:
            _call(self._on_error, error)
        else:
            log.error("Background task failed", exc_info=error)


class _Job(QRunnable):
    def __init__(self, fn: Callable[[], Any], relay: _Relay):
        super().__init__()
        self._fn, self._relay = fn, relay

    def run(self) -> None:
        try:
            result, error = self._fn(), None
        except Exception as e:  # noqa: BLE001 - every failure goes to the callback
            result, error = None, e
        self._relay.finished.emit(result, error)


class StreamTask(QObject):
    """Handle of a running stream. cancel() is immediate for the GUI (no more items are
    delivered, on_done still comes once); the worker notices at its next item and closes
    the source, since closing a socket from another thread does not wake a blocked read."""

    def __init__(self, on_items: Callback, on_done: Callback, on_error: Callback,
                 interval_ms: int, release: Callable):
        super().__init__()
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._buffer: list[Any] = []
        self._callbacks = (on_items, on_done, on_error)
        self._release = release
        self.done = False
        self._timer = QTimer(self, interval=interval_ms)
        self._timer.timeout.connect(self._flush)
        self._relay = _Relay(self._finish, self._fail, lambda _relay: None)

    def cancel(self) -> None:
        self.cancelled.set()

    def _push(self, item: Any) -> None:  # worker thread
        with self._lock:
            self._buffer.append(item)

    @Slot()
    def _flush(self) -> None:
        with self._lock:
            items, self._buffer = self._buffer, []
        if items and not self.cancelled.is_set():
            _call(self._callbacks[0], items)

    def _finish(self, _result: Any = None) -> None:
        self._end(None)

    def _fail(self, error: BaseException) -> None:
        self._end(error)

    def _end(self, error: BaseException | None) -> None:
        self._timer.stop()
        self._flush()
        self.done = True
        self._release(self)
        if error is not None and not self.cancelled.is_set():
            if self._callbacks[2] is not None:
                _call(self._callbacks[2], error)
            else:
                log.error("Background stream failed", exc_info=error)
        else:
            _call(self._callbacks[1])


class Tasks(QObject):
    """Owns the worker threads. Create one per application, on the GUI thread."""

    def __init__(self, parent: QObject | None = None, max_threads: int = 8):
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(max_threads)
        self._live: set[QObject] = set()  # keeps relays alive until they deliver

    def run(self, fn: Callable[..., Any], *args: Any, on_done: Callback = None,
            on_error: Callback = None, **kwargs: Any) -> None:
        """Call fn(*args, **kwargs) on a worker; on_done(result) or on_error(exc) follows
        on the GUI thread. Without on_error, failures are logged."""
        relay = _Relay(on_done, on_error, self._live.discard)
        self._live.add(relay)
        self.pool.start(_Job(lambda: fn(*args, **kwargs), relay))

    def stream(self, fn: Callable[..., Iterable[Any]], *args: Any, on_items: Callback = None,
               on_done: Callback = None, on_error: Callback = None,
               interval_ms: int = 50) -> StreamTask:
        """Iterate fn(*args) on a worker. on_items(list) gets batches on the GUI thread,
        then exactly one of on_done() / on_error(exc) (on_done after a cancel)."""
        task = StreamTask(on_items, on_done, on_error, interval_ms, self._live.discard)
        self._live.add(task)

        def work() -> None:
            source = fn(*args)
            iterator = iter(source)
            try:
                for item in iterator:
                    if task.cancelled.is_set():
                        break
                    task._push(item)
            finally:
                # Closing here, on the reading thread, is what tells the node to stop.
                for obj in (iterator, source):
                    close = getattr(obj, "close", None)
                    if close is not None:
                        close()

        task._timer.start()
        self.pool.start(_Job(work, task._relay))
        return task

    def wait(self, timeout_ms: int) -> bool:
        """Wait for running work (at quit). True when everything finished in time."""
        return self.pool.waitForDone(timeout_ms)

    def cancel_streams(self) -> None:
        for obj in list(self._live):
            if isinstance(obj, StreamTask):
                obj.cancel()
