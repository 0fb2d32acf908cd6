"""The figures the charts show, kept for the last few minutes: speed, time to first token
and prompt tokens read from the prefix cache per request (every request the node served,
from GET /shoal/finished: the records its /metrics counts), streams in flight on the node
(from its status), memory and watts per node (from the topology snapshots), joules per
token (the cluster's watts over the request's speed)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.snapshots import NodeCard

WINDOW_S = 300.0
OVERLAP_S = 30.0  # read again (seen ones once): a peer's clock may be a little behind


@dataclass(frozen=True)
class Request:
    at: float
    decode_tps: float | None
    ttft_s: float | None
    joules_per_token: float | None
    cached_tokens: int | None = None
    model: str | None = None
    accepted_tokens: int | None = None  # speculative decoding: drafted tokens kept


def steps(xs: list[float], ys: list[float], until: float | None = None
          ) -> tuple[list[float], list[float]]:
    """A count sampled now and then, drawn as it is: flat until it changes, then a jump
    (not a diagonal from one sample to the next), held until `until`."""
    out_x: list[float] = []
    out_y: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i:
            out_x.append(x)
            out_y.append(out_y[-1])
        out_x.append(x)
        out_y.append(y)
    if out_x and until is not None and until > out_x[-1]:
        out_x.append(until)
        out_y.append(out_y[-1])
    return out_x, out_y


class Series:
    """(time, value) points no older than the window."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.points: deque[tuple[float, float]] = deque()

    def add(self, at: float, value: float) -> None:
        self.points.append((at, value))
        while self.points and self.points[0][0] < at - self.window_s:
            self.points.popleft()

    def xs(self) -> list[float]:
        return [p[0] for p in self.points]

    def ys(self) -> list[float]:
        return [p[1] for p in self.points]

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None


class Metrics(QObject):
    changed = Signal()

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.window_s, self.clock = window_s, clock
        self.requests: deque[Request] = deque()
        self.live_tps: tuple[float, float] | None = None  # (time, tokens/s) of a reply
        self.memory: dict[str, Series] = {}  # node name -> GB used
        self.watts: dict[str, Series] = {}  # node name -> W
        self.cluster_watts = Series(window_s)
        self.power_unavailable: dict[str, str] = {}  # node name -> why
        self.in_flight = Series(window_s)  # requests the node is generating
        self.waiting = Series(window_s)  # requests waiting for a turn
        self.since = 0.0  # the node's records ending after this are yet to be read
        self._read: set[tuple[Any, ...]] = set()  # (node, seq, at) of records taken

    def _trim(self, now: float) -> None:
        while self.requests and self.requests[0].at < now - self.window_s:
            self.requests.popleft()

    def read_finished(self, client: Any) -> list[dict[str, Any]]:
        """The cluster's finished requests not read yet, each from the node that served
        it (a Poller's fetch: off the GUI thread); a little overlap, as clocks and polls
        don't line up to the millisecond."""
        return client.finished(max(0.0, self.since - OVERLAP_S), peers=True)

    def add_finished(self, records: list[dict[str, Any]]) -> None:
        """The node's records of finished requests (engine/node/metrics.py), each once."""
        now, added = self.clock(), False
        for r in records:
            key = (r.get("node"), r.get("seq"), r.get("at"))
            at = r.get("at")
            if key in self._read or not isinstance(at, (int, float)) or \
                    r.get("generation_tps") is None:
                continue
            self._read.add(key)
            self.since = max(self.since, float(at))
            self._append(min(float(at), now), r)
            added = True
        if added:
            self._read = {k for k in self._read if k[2] >= now - self.window_s - OVERLAP_S}
            self._trim(now)
            self.changed.emit()

    def add_request(self, stats: dict[str, Any]) -> None:
        """A finished reply's figures (generation_tps, ttft_s), as the chat shows them."""
        now = self.clock()
        self._append(now, stats)
        self.live_tps = None
        self._trim(now)
        self.changed.emit()

    def _append(self, now: float, stats: dict[str, Any]) -> None:
        tps, ttft = stats.get("generation_tps"), stats.get("ttft_s")
        watts = self.cluster_watts.last
        jpt = watts / tps if watts and tps else None
        kept = stats.get("accepted_tokens") if stats.get("drafted_tokens") else None
        self.requests.append(Request(now, tps, ttft, jpt, stats.get("cached_tokens"),
                                     stats.get("model"), kept))

    def end_live(self) -> None:
        """Nothing streams now (a reply finished, failed or was stopped)."""
        if self.live_tps is not None:
            self.live_tps = None
            self.changed.emit()

    def last_measured(self, model: str | None) -> float | None:
        """The decode speed the last finished reply of `model` measured."""
        for r in reversed(self.requests):
            if r.decode_tps is not None and (model is None or r.model == model):
                return r.decode_tps
        return None

    @property
    def measures_power(self) -> bool:
        """True once some node has reported watts (in the window)."""
        return bool(self.cluster_watts.points)

    def cluster_watts_now(self) -> float | None:
        return self.cluster_watts.last

    def add_status(self, status: dict[str, Any]) -> None:
        """The node's status as the app keeps it (StatusInfo's JSON, or what the app makes
        while the node can't answer): how many requests are in flight and waiting."""
        streams = status.get("streams")
        if streams is None:
            return
        now = self.clock()
        self.in_flight.add(now, float(streams.get("in_flight") or 0))
        self.waiting.add(now, float(streams.get("waiting") or 0))
        self.changed.emit()

    def add_live(self, tokens: int, seconds: float) -> None:
        """A reply still streaming: tokens so far over the time since its first token."""
        if seconds > 0.2 and tokens > 1:
            self.live_tps = (self.clock(), (tokens - 1) / seconds)
            self.changed.emit()

    def add_cards(self, cards: list[NodeCard]) -> None:
        """One topology snapshot: memory used and watts of every reachable node."""
        now = self.clock()
        total, any_watts = 0.0, False
        for c in cards:
            if c.kind in ("offline", "unpaired"):
                continue
            if c.memory is not None:
                used = c.memory.others + c.memory.shoal
                self.memory.setdefault(c.name, Series(self.window_s)).add(now, used / 1e9)
            if c.watts is not None:
                self.watts.setdefault(c.name, Series(self.window_s)).add(now, float(c.watts))
                self.power_unavailable.pop(c.name, None)
                total += float(c.watts)
                any_watts = True
            else:
                self.power_unavailable[c.name] = (c.power_unavailable or
                                                  "unavailable: the node reports no power")
        if any_watts:
            self.cluster_watts.add(now, total)
        self._trim(now)
        self.changed.emit()
