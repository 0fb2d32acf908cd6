"""Logs that can't fill the disk: size-capped files that rotate, and a message repeated
many times a second (a flood of refused connections, a peer failing every poll) written
once a second at most, with a count of what was left out."""

from __future__ import annotations

import logging
import logging.handlers
import time
from collections.abc import Callable
from pathlib import Path

MAX_BYTES = 10 * 2**20  # a log file this big is rotated
BACKUPS = 3  # node.log.1 .. node.log.3 are kept


class OncePerSecond(logging.Filter):
    """Passes the first warning or error of each kind (logger, level, message template)
    per `every` seconds; the next one that passes says how many were held back."""

    def __init__(self, every: float = 1.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every = every
        self._clock = clock
        self._last: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, "_shoal_once", None)
        if decided is not None:  # the same record at the next handler
            return bool(decided)
        passed = self._decide(record)
        record._shoal_once = passed  # type: ignore[attr-defined]
        return passed

    def _decide(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:  # a request's own line is never held back
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        last, held = self._last.get(key, (-self.every, 0))
        if now - last < self.every:
            self._last[key] = (last, held + 1)
            return False
        self._last[key] = (now, 0)
        if len(self._last) > 4096:  # kinds seen long ago are forgotten
            self._last = {k: v for k, v in self._last.items() if now - v[0] < 60}
            self._last[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the last " \
                         f"{now - last:.0f} s)"
        return True


def rotating_file(path: Path) -> logging.Handler:
    """A handler for `path` that rotates at MAX_BYTES, keeping BACKUPS old files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return logging.handlers.RotatingFileHandler(path, maxBytes=MAX_BYTES,
                                                backupCount=BACKUPS, encoding="utf-8")


def setup(file: Path | None, verbose: bool = False) -> None:
    """The process's logging: stderr (at SHOAL_CONSOLE_LOG's level, all by default) and,
    given `file`, a rotating file; every handler rate-limited."""
    import os
    import sys
    console = logging.StreamHandler(sys.stderr)
    # the app keeps a node's console in a file of its own: there only what matters
    console.setLevel(os.environ.get("SHOAL_CONSOLE_LOG", "DEBUG").upper())
    handlers: list[logging.Handler] = [console]
    if file is not None:
        handlers.append(rotating_file(file))
    limit = OncePerSecond()
    for h in handlers:
        h.addFilter(limit)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def rotate_if_big(path: Path, limit: int = MAX_BYTES) -> None:
    """Rotate a log another process writes (a worker's stdout) before it is reopened."""
    try:
        if path.stat().st_size < limit:
            return
    except FileNotFoundError:
        return
    for i in range(BACKUPS - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{i + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


def quiet_loop_errors(loop: object) -> None:
    """asyncio's own error reports (a failed accept, a transport's error) through the
    rate limit, as one line: without it a flood of sockets logged a traceback each."""
    import asyncio
    assert isinstance(loop, asyncio.AbstractEventLoop)
    log = logging.getLogger("asyncio")

    def handle(lp: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        log.warning("%s%s", context.get("message", "event loop error"),
                    f": {type(exc).__name__}: {exc}" if exc else "")
    loop.set_exception_handler(handle)
