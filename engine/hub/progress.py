"""Download progress (engine.records.DownloadProgress snapshots): bytes done and total
per file and overall, speed over a short window, and the time left."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

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


class Tracker:
    """Thread-safe progress of one pull; calls back at most every `interval` seconds."""

    def __init__(self, repo_id: str, revision: str,
                 cb: Callable[[DownloadProgress], None] | None, interval: float = 0.2):
        self.repo_id, self.revision, self.cb, self.interval = repo_id, revision, cb, interval
        self._files: dict[str, dict[str, Any]] = {}
        self._rate, self._lock, self._last = _Rate(), threading.Lock(), 0.0

    def add_files(self, files: Sequence[RemoteFile]) -> None:
        with self._lock:
            for f in files:
                self._files.setdefault(f.path, {"done": 0, "total": f.size, "state": "waiting",
                                                "source": None, "rate": _Rate()})

    def start(self, path: str, done: int, source: str) -> None:
        """A file (re)starts from `done` bytes already on disk: not counted as speed."""
        with self._lock:
            self._files[path].update(done=done, state="downloading", source=source)
        self.emit(force=True)

    def update(self, path: str, done: int, state: str | None = None,
               source: str | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            e = self._files[path]
            if e["state"] == "downloading" and done > e["done"]:
                e["rate"].add(now, done - e["done"])
                self._rate.add(now, done - e["done"])
            e.update(done=done, state=state or e["state"], source=source or e["source"])
        self.emit(force=state is not None)

    def snapshot(self) -> DownloadProgress:
        now = time.monotonic()
        with self._lock:
            files = [FileProgress(p, e["done"], e["total"], e["state"], e["source"],
                                  e["rate"].speed(now), _eta(e, e["rate"].speed(now)))
                     for p, e in self._files.items()]
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


def _eta(e: dict[str, Any], speed: float) -> float | None:
    if e["state"] == "done":
        return 0.0
    return (e["total"] - e["done"]) / speed if speed > 0 else None
