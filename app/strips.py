"""One strip per node showing the layers it holds, on a shared layer axis. The boundary
between two neighbouring ranks is a handle: drag it to move layers from one node to the
next. The widget only edits the ranges; what they mean is the planner's business."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QMouseEvent, QPainter, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from app import theme

NAME_W, ROW_H, GAP, TOP, GRAB_PX = 150.0, 30.0, 10.0, 22.0, 7.0


class LayerStrips(QWidget):
    """ranges_changed(list[(start, end)]) while a boundary is dragged; drag_finished()
    when the mouse lets go."""

    ranges_changed = Signal(list)
    drag_finished = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.names: list[str] = []
        self.ranges: list[tuple[int, int]] = []
        self.layers = 0
        self.strategy = "pipeline"
        self.feasible = True
        self._drag: int | None = None  # index of the boundary being dragged
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(420)
        self.setAccessibleName("Layers per machine")
        self._resize_rows()

    # --- state ----------------------------------------------------------------------------
    def set_layout(self, names: list[str], ranges: list[tuple[int, int]], layers: int,
                   strategy: str) -> None:
        if self._drag is not None and len(names) == len(self.names):
            return  # the user is dragging: their ranges win over a late plan answer
        self.names, self.layers, self.strategy = list(names), layers, strategy
        self.ranges = [(int(s), int(e)) for s, e in ranges]
        self._resize_rows()
        self.update()

    def set_feasible(self, feasible: bool) -> None:
        self.feasible = feasible
        self.update()

    @property
    def draggable(self) -> bool:
        return self.strategy == "pipeline" and len(self.ranges) > 1 and self.layers > 0

    def _resize_rows(self) -> None:
        rows = max(len(self.names), 1)
        self.setFixedHeight(int(TOP + rows * (ROW_H + GAP) + 16))

    # --- geometry (public so tests can aim the mouse) -------------------------------------
    def x_of(self, layer: float) -> float:
        span = max(self.width() - NAME_W - 20, 1)
        return NAME_W + span * layer / max(self.layers, 1)

    def layer_at(self, x: float) -> int:
        span = max(self.width() - NAME_W - 20, 1)
        return round((x - NAME_W) / span * max(self.layers, 1))

    def row_rect(self, i: int) -> QRectF:
        return QRectF(NAME_W, TOP + i * (ROW_H + GAP), self.width() - NAME_W - 20, ROW_H)

    def handle_point(self, i: int) -> QPointF:
        """The middle of the handle between rank i and rank i + 1."""
        top, bottom = self.row_rect(i), self.row_rect(i + 1)
        return QPointF(self.x_of(self.ranges[i][1]), (top.center().y() + bottom.center().y()) / 2)

    def _handle_at(self, pos: QPointF) -> int | None:
        if not self.draggable:
            return None
        for i in range(len(self.ranges) - 1):
            top, bottom = self.row_rect(i), self.row_rect(i + 1)
            if (abs(pos.x() - self.x_of(self.ranges[i][1])) <= GRAB_PX
                    and top.top() - 4 <= pos.y() <= bottom.bottom() + 4):
                return i
        return None

    # --- mouse ----------------------------------------------------------------------------
    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt's name
        self._drag = self._handle_at(event.position())
        if self._drag is None:
            super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt's name
        pos = event.position()
        if self._drag is None:
            hover = self._handle_at(pos) is not None
            self.setCursor(Qt.CursorShape.SplitHCursor if hover else Qt.CursorShape.ArrowCursor)
            return
        i = self._drag
        # Either neighbour may end up empty; the planner then says why that can't run.
        value = min(max(self.layer_at(pos.x()), self.ranges[i][0]), self.ranges[i + 1][1])
        if value != self.ranges[i][1]:
            self.ranges[i] = (self.ranges[i][0], value)
            self.ranges[i + 1] = (value, self.ranges[i + 1][1])
            self.update()
            self.ranges_changed.emit(list(self.ranges))

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt's name
        if self._drag is not None:
            self._drag = None
            self.drag_finished.emit()
        else:
            super().mouseReleaseEvent(event)

    # --- painting -------------------------------------------------------------------------
    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.update()

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt's name
        pal = self.palette()
        text, muted = pal.color(QPalette.ColorRole.WindowText), theme.muted(pal)
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        if not self.names or not self.layers:
            p.setPen(muted)
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "No placement yet")
            return
        p.setPen(muted)
        for layer in sorted({0, self.layers, *(e for _, e in self.ranges[:-1])}):
            p.drawText(QRectF(self.x_of(layer) - 20, 2, 40, 16), Qt.AlignmentFlag.AlignCenter,
                       str(layer))
        for i, name in enumerate(self.names):
            row = self.row_rect(i)
            p.setPen(text)
            p.drawText(QRectF(4, row.top(), NAME_W - 10, ROW_H),
                       Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                       p.fontMetrics().elidedText(name, Qt.TextElideMode.ElideRight,
                                                  int(NAME_W - 12)))
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(theme.colour("track", pal))
            p.drawRoundedRect(row, 4, 4)
            if i >= len(self.ranges):
                continue
            start, end = self.ranges[i]
            colour = theme.series(i, pal) if self.feasible else theme.colour("error", pal)
            bar = QRectF(self.x_of(start), row.top(), self.x_of(end) - self.x_of(start),
                         ROW_H)
            brush = QBrush(colour)
            if self.strategy == "tensor":
                brush.setStyle(Qt.BrushStyle.BDiagPattern)
            p.setBrush(brush)
            p.setPen(QPen(colour.darker(130), 1))
            if bar.width() > 0:
                p.drawRoundedRect(bar, 4, 4)
            inside = self.strategy != "tensor" and bar.width() > 60
            p.setPen(theme.readable_on(colour) if inside else text)
            p.drawText(bar if bar.width() > 60 else row, Qt.AlignmentFlag.AlignCenter,
                       self._range_text(start, end))
        if self.draggable:
            for i in range(len(self.ranges) - 1):
                self._paint_handle(p, i, text, pal.color(QPalette.ColorRole.Base))

    def _range_text(self, start: int, end: int) -> str:
        if self.strategy == "tensor":
            return f"1/{len(self.ranges)} of every layer"
        if end <= start:
            return "no layers"
        if end - start == 1:
            return f"layer {start} (1)"
        return f"layers {start}–{end - 1} ({end - start})"

    def _paint_handle(self, p: QPainter, i: int, line: QColor, fill: QColor) -> None:
        x = self.x_of(self.ranges[i][1])
        top, bottom = self.row_rect(i), self.row_rect(i + 1)
        p.setPen(QPen(line, 2))
        p.drawLine(QPointF(x, top.top() - 3), QPointF(x, bottom.bottom() + 3))
        mid = self.handle_point(i)
        p.setBrush(fill)
        p.drawRoundedRect(QRectF(mid.x() - 5, mid.y() - 9, 10, 18), 3, 3)
