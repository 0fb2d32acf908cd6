"""Live charts (pyqtgraph): decode tokens/s and time to first token per request, memory and
watts per node and for the cluster, joules per token, requests on the node and prompt
tokens from the prefix cache. The time axis scrolls with the clock (10 frames a second
while the view is on screen); data is re-plotted only when the figures changed.

Charts of what no node measures (power, and so energy per token) are hidden, with one
plain line that says why; a chart with nothing yet says so ("No requests yet"). Legends
sit below the plot, never over the newest points, and the time axis leaves room at the
right for the marker of the reply streaming now. The grid has two columns where there is
room and one where there isn't; colours follow the palette."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from app import theme
from app.metrics import Metrics, steps

FRAME_MS = 100
TWO_COLUMNS_PX = 960  # narrower than this, one chart a row
RIGHT_ROOM = 0.04  # of the time window, right of "now": the live marker is drawn whole
Y_PADDING = 0.12  # above and below the points, so the top one's marker isn't cut
pg.setConfigOptions(antialias=True)


class Legend(pg.LegendItem):
    """A legend in its own row under the time axis (pyqtgraph's floats over the data)."""

    def updateSize(self) -> None:  # noqa: N802 - pyqtgraph's name
        self.updateGeometry()  # the plot's layout sizes it (not a fixed box at 0, 0)


def _plot(title: str, unit: str, empty: str = "No requests yet") -> pg.PlotWidget:
    plot = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem()})
    plot.chart_title = title
    plot.setTitle(title)
    plot.setLabel("left", unit)
    plot.setAccessibleName(f"Chart: {title}")
    plot.getAxis("left").enableAutoSIPrefix(False)  # seconds stay seconds
    plot.showGrid(x=True, y=True, alpha=0.25)
    plot.setMouseEnabled(x=False, y=False)
    plot.setMenuEnabled(False)
    item = plot.getPlotItem()
    item.legend = Legend(colCount=4)  # plots named later join it (pyqtgraph's own rule)
    item.layout.addItem(item.legend, 4, 1)
    item.getViewBox().setDefaultPadding(Y_PADDING)
    plot.empty_label = pg.LabelItem(empty)  # shown while the chart has no points
    plot.empty_label.setParentItem(item.getViewBox())
    plot.empty_label.anchor(itemPos=(0.5, 0.5), parentPos=(0.5, 0.5))
    plot.setMinimumHeight(190)
    plot.setMinimumWidth(300)
    return plot


def _has_points(plot: pg.PlotWidget) -> bool:
    return any(c.xData is not None and len(c.xData) for c in
               plot.getPlotItem().listDataItems())


def power_line(unavailable: dict[str, str]) -> tuple[str, str]:
    """One plain line for why there is no power chart, and the nodes' own words for the
    tooltip (driver messages are long and say little to most people)."""
    names = ", ".join(sorted(unavailable)) or "any node"
    details = "\n".join(f"{name}: {why.removeprefix('unavailable: ')}"
                        for name, why in sorted(unavailable.items()))
    return (f"Power and energy per token aren't shown: no node measures its power "
            f"({names}). Macs report it; on Linux it needs readable RAPL counters or an "
            "NVIDIA GPU.", details)


class ChartsView(QWidget):
    def __init__(self, metrics: Metrics, parent: QWidget | None = None):
        super().__init__(parent)
        self.metrics = metrics
        self.tps = _plot("Decode speed per request", "tokens/s")
        self.ttft = _plot("Time to first token per request", "s")
        self.memory = _plot("Memory used per machine", "GB", "No readings yet")
        self.power = _plot("Power", "W", "No readings yet")
        self.energy = _plot("Energy per token", "J/token")
        self.streams = _plot("Requests on the node", "requests", "No readings yet")
        self.cached = _plot("Tokens per request: from the prefix cache, drafts kept", "tokens")
        self.plots = [self.tps, self.ttft, self.memory, self.power, self.energy,
                      self.streams, self.cached]
        for p in self.plots[1:]:
            p.setXLink(self.tps)
        self.tps_curve = self.tps.plot([], [], name="finished", symbol="o", symbolSize=7)
        self.live_curve = self.tps.plot([], [], pen=None, symbol="t", symbolSize=10,
                                        name="streaming now")
        self.ttft_curve = self.ttft.plot([], [], symbol="o", symbolSize=7)
        self.energy_curve = self.energy.plot([], [], symbol="o", symbolSize=7,
                                             name="measured")
        # the placement view's prediction for what it shows, beside what was measured
        self.energy_predicted = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(
            style=Qt.PenStyle.DashLine), label="predicted {value:.2f} J/token",
            labelOpts={"position": 0.1})
        self.energy_predicted.hide()
        self.energy.addItem(self.energy_predicted)
        self.in_flight_curve = self.streams.plot([], [], name="in flight")
        self.waiting_curve = self.streams.plot([], [], name="waiting")
        self.cached_curve = self.cached.plot([], [], pen=None, symbol="o", symbolSize=7,
                                             name="prompt tokens cached")
        self.drafts_curve = self.cached.plot([], [], pen=None, symbol="t", symbolSize=9,
                                             name="drafted tokens kept")
        self.node_curves: dict[tuple[str, str], pg.PlotDataItem] = {}
        self.cluster_curve = self.power.plot([], [], name="cluster")
        self.power_note = QLabel()
        self.power_note.setObjectName("powerUnavailable")
        self.power_note.setWordWrap(True)
        theme.set_role(self.power_note, "muted")
        self.power_note.hide()
        self.energy_note = self.power_note  # one line says it for both charts

        self._grid = QGridLayout()
        inner = QWidget()
        for p in self.plots:  # owned by the view even while hidden
            p.setParent(inner)
        column = QVBoxLayout(inner)
        column.addWidget(self.power_note)
        column.addLayout(self._grid)
        column.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(inner)
        QVBoxLayout(self).addWidget(scroll)
        self.columns = 0
        self._dirty = True
        self._style()
        self._reflow()
        metrics.changed.connect(self._mark)
        self.frame = QTimer(self, interval=FRAME_MS)
        self.frame.timeout.connect(self.tick)

    # --- layout and looks -----------------------------------------------------------------
    def shown_plots(self) -> list[pg.PlotWidget]:
        power = self.metrics.measures_power
        return [p for p in self.plots if power or p not in (self.power, self.energy)]

    def _reflow(self) -> None:
        """Lay the shown charts out in one or two columns (for the width there is)."""
        columns = 2 if self.width() >= TWO_COLUMNS_PX else 1
        shown = self.shown_plots()
        placed = [self._grid.itemAt(i).widget() for i in range(self._grid.count())]
        if columns == self.columns and placed == shown:
            return
        self.columns = columns
        for p in placed:
            self._grid.removeWidget(p)
        for i, p in enumerate(shown):
            self._grid.addWidget(p, i // columns, i % columns)
        for p in self.plots:  # after adding: a plot never added has no parent yet
            p.setVisible(p in shown)

    def _style(self) -> None:
        pal = self.palette()
        bg = pal.color(QPalette.ColorRole.Base)
        fg = pal.color(QPalette.ColorRole.Text)
        for p in self.plots:
            p.setBackground(bg)
            p.setTitle(p.chart_title, color=fg.name())
            for side in ("left", "bottom"):
                axis = p.getAxis(side)
                axis.setPen(fg)
                axis.setTextPen(fg)
            self._legend_colour(p, fg)
            p.empty_label.setText(p.empty_label.text, color=theme.muted(pal).name())
        points = {self.tps_curve: 0, self.ttft_curve: 3, self.energy_curve: 4,
                  self.cached_curve: 1, self.drafts_curve: 2}
        for curve, i in points.items():
            colour = theme.series(i, pal)
            if curve not in (self.cached_curve, self.drafts_curve):
                curve.setPen(pg.mkPen(colour, width=2))
            curve.setSymbolBrush(colour)
        self.live_curve.setSymbolBrush(theme.series(2, pal))
        self.in_flight_curve.setPen(pg.mkPen(theme.series(1, pal), width=2))
        self.waiting_curve.setPen(pg.mkPen(theme.series(3, pal), width=2))
        self.cluster_curve.setPen(pg.mkPen(fg, width=3))
        for curve in self.node_curves.values():
            curve.setPen(pg.mkPen(theme.series(curve.series_index, pal), width=2))

    @staticmethod
    def _legend_colour(plot: pg.PlotWidget, colour) -> None:  # noqa: ANN001 - a QColor
        legend = plot.getPlotItem().legend
        if legend is None:
            return
        legend.setLabelTextColor(colour)
        for _sample, label in legend.items:  # pyqtgraph repaints a label only on setText
            label.setText(label.text, color=colour.name())

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._style()

    def resizeEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt's name
        super().resizeEvent(event)
        self._reflow()

    # --- frames ---------------------------------------------------------------------------
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
        now, window = self.metrics.clock(), self.metrics.window_s
        self.tps.setXRange(now - window, now + window * RIGHT_ROOM, padding=0)

    def set_predicted_energy(self, joules_per_token: float | None) -> None:
        """The planner's joules per token for the placement shown (None: not predicted,
        where a node's watts are unknown)."""
        self.energy_predicted.setVisible(bool(joules_per_token))
        if joules_per_token:
            self.energy_predicted.setValue(joules_per_token)

    def redraw(self) -> None:
        m = self.metrics
        now = m.clock()
        reqs = list(m.requests)
        self._set(self.tps_curve, [(r.at, r.decode_tps) for r in reqs])
        self._set(self.live_curve, [m.live_tps] if m.live_tps else [])
        self._set(self.ttft_curve, [(r.at, r.ttft_s) for r in reqs])
        self._set(self.energy_curve, [(r.at, r.joules_per_token) for r in reqs])
        self._set(self.cached_curve, [(r.at, r.cached_tokens) for r in reqs])
        self._set(self.drafts_curve, [(r.at, r.accepted_tokens) for r in reqs])
        self.in_flight_curve.setData(*steps(m.in_flight.xs(), m.in_flight.ys(), now))
        self.waiting_curve.setData(*steps(m.waiting.xs(), m.waiting.ys(), now))
        for i, (name, series) in enumerate(sorted(m.memory.items())):
            self._node_curve(self.memory, "memory", name, i).setData(series.xs(), series.ys())
        for i, (name, series) in enumerate(sorted(m.watts.items())):
            self._node_curve(self.power, "watts", name, i).setData(series.xs(), series.ys())
        self.cluster_curve.setData(m.cluster_watts.xs(), m.cluster_watts.ys())
        if not m.power_unavailable:
            self.power_note.setText("")
            self.power_note.setToolTip("")
        elif m.measures_power:  # some nodes measure it, these don't
            names = ", ".join(sorted(m.power_unavailable))
            self.power_note.setText(f"No power reading from {names} at the moment.")
            self.power_note.setToolTip(power_line(m.power_unavailable)[1])
        else:
            line, details = power_line(m.power_unavailable)
            self.power_note.setText(line)
            self.power_note.setToolTip(details)
        self.power_note.setVisible(bool(self.power_note.text()))
        for p in self.plots:
            p.empty_label.setVisible(not _has_points(p))
        self._reflow()

    def _node_curve(self, plot: pg.PlotWidget, kind: str, name: str,
                    i: int) -> pg.PlotDataItem:
        key = (kind, name)
        if key not in self.node_curves:
            curve = plot.plot([], [], name=name, pen=pg.mkPen(theme.series(i), width=2))
            curve.series_index = i
            self.node_curves[key] = curve
            self._legend_colour(plot, self.palette().color(QPalette.ColorRole.Text))
        return self.node_curves[key]

    @staticmethod
    def _set(curve: pg.PlotDataItem, points: list[tuple[float, float | None]]) -> None:
        points = [(x, y) for x, y in points if y is not None]
        curve.setData([p[0] for p in points], [p[1] for p in points])
