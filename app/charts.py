"""Live charts (pyqtgraph): decode tokens/s and time to first token per request, memory and
watts per node and for the cluster, joules per token. The time axis scrolls with the
clock (10 frames a second while the view is on screen); data is re-plotted only when the
figures changed."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from app.metrics import Metrics
from app.strips import PALETTE

FRAME_MS = 100
pg.setConfigOptions(antialias=True, background="w", foreground="#303030")


def _plot(title: str, unit: str) -> pg.PlotWidget:
    plot = pg.PlotWidget(title=title, axisItems={"bottom": pg.DateAxisItem()})
    plot.setLabel("left", unit)
    plot.getAxis("left").enableAutoSIPrefix(False)  # seconds stay seconds
    plot.showGrid(x=True, y=True, alpha=0.25)
    plot.setMouseEnabled(x=False, y=False)
    plot.setMenuEnabled(False)
    plot.addLegend(offset=(-10, 10))
    plot.setMinimumHeight(170)
    return plot


class ChartsView(QWidget):
    def __init__(self, metrics: Metrics, parent: QWidget | None = None):
        super().__init__(parent)
        self.metrics = metrics
        self.tps = _plot("Decode speed per request", "tokens/s")
        self.ttft = _plot("Time to first token per request", "s")
        self.memory = _plot("Memory used per node", "GB")
        self.power = _plot("Power", "W")
        self.energy = _plot("Energy per token", "J/token")
        self.streams = _plot("Requests on the node", "requests")
        self.cached = _plot("Prompt tokens from the prefix cache per request", "tokens")
        self.plots = [self.tps, self.ttft, self.memory, self.power, self.energy,
                      self.streams, self.cached]
        for p in self.plots[1:]:
            p.setXLink(self.tps)
        pen = pg.mkPen(PALETTE[0], width=2)
        self.tps_curve = self.tps.plot([], [], pen=pen, symbol="o", symbolSize=7,
                                       symbolBrush=PALETTE[0], name="finished")
        self.live_curve = self.tps.plot([], [], pen=None, symbol="t", symbolSize=10,
                                        symbolBrush=PALETTE[2], name="streaming now")
        self.ttft_curve = self.ttft.plot([], [], pen=pg.mkPen(PALETTE[3], width=2),
                                         symbol="o", symbolSize=7, symbolBrush=PALETTE[3])
        self.energy_curve = self.energy.plot([], [], pen=pg.mkPen(PALETTE[4], width=2),
                                             symbol="o", symbolSize=7,
                                             symbolBrush=PALETTE[4])
        self.streams.addLegend(offset=(5, 5))
        self.in_flight_curve = self.streams.plot([], [], pen=pg.mkPen(PALETTE[1], width=2),
                                                 name="in flight")
        self.waiting_curve = self.streams.plot([], [], pen=pg.mkPen(PALETTE[3], width=2),
                                               name="waiting")
        self.cached_curve = self.cached.plot([], [], pen=None, symbol="o", symbolSize=7,
                                             symbolBrush=PALETTE[1])
        self.node_curves: dict[tuple[str, str], pg.PlotDataItem] = {}
        self.cluster_curve = self.power.plot([], [], pen=pg.mkPen("#202020", width=3),
                                             name="cluster")
        self.power_note = QLabel()
        self.power_note.setObjectName("powerUnavailable")
        self.power_note.setWordWrap(True)
        self.power_note.setStyleSheet("color: #b05a00;")
        self.energy_note = QLabel()
        self.energy_note.setWordWrap(True)
        self.energy_note.setStyleSheet("color: gray;")
        grid = QGridLayout()
        grid.addWidget(self.tps, 0, 0)
        grid.addWidget(self.ttft, 0, 1)
        grid.addWidget(self.memory, 1, 0)
        grid.addWidget(self.power, 1, 1)
        grid.addWidget(self.energy, 2, 0)
        side = QVBoxLayout()
        side.addWidget(self.power_note)
        side.addWidget(self.energy_note)
        side.addStretch(1)
        grid.addLayout(side, 2, 1)
        grid.addWidget(self.streams, 3, 0)
        grid.addWidget(self.cached, 3, 1)
        QVBoxLayout(self).addLayout(grid)
        self._dirty = True
        metrics.changed.connect(self._mark)
        self.frame = QTimer(self, interval=FRAME_MS)
        self.frame.timeout.connect(self.tick)

    def _mark(self) -> None:
        self._dirty = True

    def showEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt's name
        super().showEvent(event)
        self.frame.start()
        self.tick()

    def hideEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt's name
        super().hideEvent(event)
        self.frame.stop()

    def tick(self) -> None:
        """One frame: re-plot if the figures changed, then scroll the time axis."""
        if self._dirty:
            self._dirty = False
            self.redraw()
        now = self.metrics.clock()
        self.tps.setXRange(now - self.metrics.window_s, now, padding=0)

    def redraw(self) -> None:
        m = self.metrics
        reqs = list(m.requests)
        self._set(self.tps_curve, [(r.at, r.decode_tps) for r in reqs])
        self._set(self.live_curve, [m.live_tps] if m.live_tps else [])
        self._set(self.ttft_curve, [(r.at, r.ttft_s) for r in reqs])
        self._set(self.energy_curve, [(r.at, r.joules_per_token) for r in reqs])
        self._set(self.cached_curve, [(r.at, r.cached_tokens) for r in reqs])
        self.in_flight_curve.setData(m.in_flight.xs(), m.in_flight.ys())
        self.waiting_curve.setData(m.waiting.xs(), m.waiting.ys())
        for i, (name, series) in enumerate(sorted(m.memory.items())):
            self._node_curve(self.memory, "memory", name, i).setData(series.xs(), series.ys())
        for i, (name, series) in enumerate(sorted(m.watts.items())):
            self._node_curve(self.power, "watts", name, i).setData(series.xs(), series.ys())
        self.cluster_curve.setData(m.cluster_watts.xs(), m.cluster_watts.ys())
        by_reason: dict[str, list[str]] = {}
        for name, why in sorted(m.power_unavailable.items()):
            by_reason.setdefault(why.removeprefix("unavailable: "), []).append(name)
        self.power_note.setText("\n".join(f"Power unavailable on {', '.join(names)}: {why}"
                                          for why, names in by_reason.items()))
        self.energy_note.setText(
            "" if m.cluster_watts.points else
            "Joules per token need the power of the nodes: unavailable while no node "
            "reports watts.")

    def _node_curve(self, plot: pg.PlotWidget, kind: str, name: str,
                    i: int) -> pg.PlotDataItem:
        key = (kind, name)
        if key not in self.node_curves:
            self.node_curves[key] = plot.plot([], [], name=name, pen=pg.mkPen(
                PALETTE[i % len(PALETTE)], width=2))
        return self.node_curves[key]

    @staticmethod
    def _set(curve: pg.PlotDataItem, points: list[tuple[float, float | None]]) -> None:
        points = [(x, y) for x, y in points if y is not None]
        curve.setData([p[0] for p in points], [p[1] for p in points])
