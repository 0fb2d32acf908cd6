"""Download progress (engine.records.DownloadProgress snapshots): bytes done and total
per file and overall, speed over a short window, and the time left."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.hub.hfcache import RemoteFile
from engine.records import DownloadProgress, FileProgress


class _Rate:
    """Bytes per second over the last few seconds (fresh bytes only, not resumed ones)."""
    WINDOW_S = 3.0

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()
        self.first = 0.0

    def add(self, now: float, n: int) -> None:
        if not self.samples:
            self.first = now
        self.samples.append((now, n))

    def speed(self, now: float) -> float:
        while self.samples and self.samples[0][0] < now - self.WINDOW_S:
            self.samples.popleft()
        if not self.samples:
            return 0.0
        span = now - max(self.first, now - self.WINDOW_S)
        return sum(n for _, n in self.samples) / max(span, 0.25)


@dataclass
class _File:
    """Where one file's pull stands (snapshot() reports it as a FileProgress)."""
    total: int
    done: int = 0
    state: str = "waiting"
    source: str | None = None
    rate: _Rate = field(default_factory=_Rate)

    def eta(self, speed: float) -> float | None:
        if self.state == "done":
            return 0.0
        return (self.total - self.done) / speed if speed > 0 else None


class Tracker:
    """Thread-safe progress of one pull; calls back at most every `interval` seconds."""

    def __init__(self, repo_id: str, revision: str,
                 cb: Callable[[DownloadProgress], None] | None, interval: float = 0.2):
        self.repo_id, self.revision, self.cb, self.interval = repo_id, revision, cb, interval
        self._files: dict[str, _File] = {}
        self._rate, self._lock, self._last = _Rate(), threading.Lock(), 0.0

    def add_files(self, files: Sequence[RemoteFile]) -> None:
        with self._lock:
            for f in files:
                self._files.setdefault(f.path, _File(f.size))

    def start(self, path: str, done: int, source: str) -> None:
        """A file (re)starts from `done` bytes already on disk: not counted as speed."""
        with self._lock:
            e = self._files[path]
            e.done, e.state, e.source = done, "downloading", source
        self.emit(force=True)

    def update(self, path: str, done: int, state: str | None = None,
               source: str | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            e = self._files[path]
            if e.state == "downloading" and done > e.done:
                e.rate.add(now, done - e.done)
                self._rate.add(now, done - e.done)
            e.done, e.state, e.source = done, state or e.state, source or e.source
        self.emit(force=state is not None)

    def snapshot(self) -> DownloadProgress:
        now = time.monotonic()
        with self._lock:
            files = [FileProgress(p, e.done, e.total, e.state, e.source, e.rate.speed(now),
                                  e.eta(e.rate.speed(now))) for p, e in self._files.items()]
            speed = self._rate.speed(now)
        done, total = sum(f.done for f in files), sum(f.total for f in files)
        return DownloadProgress(self.repo_id, self.revision, done, total, speed,
                                (total - done) / speed if speed > 0 else None, files)

    def emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.cb is None or (not force and now - self._last < self.interval):
            return
        self._last = now
        self.cb(self.snapshot())
