"""The topology view: one card per machine (name, chip, OS, memory bar), one edge per
measured link (type, latency, bandwidth), and below them what needs fixing on which
machine. Cards come and go as the topology snapshots do; nothing here computes cluster
state, it draws ClusterState's cards and edges."""

from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPen
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsLineItem,
    QGraphicsObject,
    QGraphicsRectItem,
    QGraphicsScene,
    QGraphicsSimpleTextItem,
    QGraphicsView,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from app.cluster_state import ClusterState
from app.common import fmt_bytes
from app.snapshots import LinkEdge, MemoryBar, NodeCard

CARD_W, CARD_H = 250.0, 142.0  # CARD_H: the tallest card (with a badge line)
SEGMENTS = (("others", "#9a9a9a", "used by other programs"),
            ("shoal", "#2f7fd8", "used by Shoal"),
            ("planned", "#e0a020", "planned for the selected placement"),
            ("free", "#dcefdc", "free"))
BORDERS = {"ok": "#5a5a5a", "offline": "#9a9a9a", "unpaired": "#e07b20", "mismatch": "#d03b3b"}
BADGES = {"offline": "Offline", "unpaired": "Not in this cluster",
          "mismatch": "Version mismatch"}


def memory_legend(bar: MemoryBar) -> str:
    used = bar.others + bar.shoal
    text = f"{fmt_bytes(used)} of {fmt_bytes(bar.total)} used"
    if bar.shoal:
        text += f", {fmt_bytes(bar.shoal)} by Shoal"
    if bar.planned or bar.overflow:
        text = f"{fmt_bytes(used)} used + {fmt_bytes(bar.planned + bar.overflow)} planned " \
               f"of {fmt_bytes(bar.total)}"
    return text


class NodeCardItem(QGraphicsObject):
    """One machine. `card` is the NodeCard it shows; set_card repaints it."""

    def __init__(self, card: NodeCard):
        super().__init__()
        self.card = card
        self.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable, False)
        self.set_card(card)

    def set_card(self, card: NodeCard) -> None:
        if card.kind != getattr(self, "card", card).kind:
            self.prepareGeometryChange()  # a badge line more or less
        self.card = card
        self.setOpacity(0.55 if card.kind == "offline" else 1.0)
        tip = [card.name, *(x for x in (card.url, card.detail) if x), *card.warnings]
        if card.memory and card.memory.rule:
            tip.append(f"Memory: {card.memory.rule}")
        self.setToolTip("\n".join(tip))
        self.update()

    def height(self) -> float:
        return CARD_H - (17 if self.card.kind == "ok" else 0)

    def boundingRect(self) -> QRectF:  # noqa: N802 - Qt's name
        return QRectF(-2, -2, CARD_W + 4, self.height() + 4)

    def lines(self) -> list[str]:
        """The text lines of the card, top to bottom (also what tests read)."""
        c = self.card
        out = [c.name + ("  (this node)" if c.is_self else "")]
        if c.kind != "ok":
            out.append(f"{BADGES[c.kind]}: {c.detail}" if c.detail else BADGES[c.kind])
        out.append(c.chip or "chip unknown")
        out.append(c.os or "")
        out.append(memory_legend(c.memory) if c.memory else "memory unknown")
        status = []
        if c.state:
            status.append(c.state)
        if c.watts is not None:
            status.append(f"{c.watts:.0f} W")
        elif c.power_unavailable:
            status.append("power unavailable")
        if c.version:
            status.append(f"v{c.version}")
        if c.warnings:
            status.append(f"⚠ {len(c.warnings)} to fix")
        out.append(" · ".join(status))
        return out

    def paint(self, painter: QPainter, option, widget=None) -> None:  # noqa: ANN001
        c = self.card
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pen = QPen(QColor(BORDERS[c.kind]), 2.5 if c.is_self else 1.5)
        if c.kind in ("offline", "unpaired"):
            pen.setStyle(Qt.PenStyle.DashLine)
        painter.setPen(pen)
        painter.setBrush(QColor("#fff7ee" if c.kind == "unpaired" else
                                "#fdecec" if c.kind == "mismatch" else "#ffffff"))
        painter.drawRoundedRect(QRectF(0, 0, CARD_W, self.height()), 10, 10)

        lines = self.lines()
        title = QFont(painter.font())
        title.setBold(True)
        title.setPointSizeF(max(title.pointSizeF(), 9.0) + 1)
        painter.setFont(title)
        painter.setPen(QColor("#202020"))
        painter.drawText(QRectF(10, 6, CARD_W - 20, 20), Qt.AlignmentFlag.AlignLeft,
                         lines[0])
        body = QFont(painter.font())
        body.setBold(False)
        body.setPointSizeF(title.pointSizeF() - 2)
        painter.setFont(body)
        y = 28.0
        for i, text in enumerate(lines[1:-2]):
            colour = BORDERS[c.kind] if (i == 0 and c.kind != "ok") else "#404040"
            painter.setPen(QColor(colour))
            painter.drawText(QRectF(10, y, CARD_W - 20, 18), Qt.AlignmentFlag.AlignLeft,
                             painter.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight,
                                                              int(CARD_W - 20)))
            y += 17
        y += 5
        self._paint_bar(painter, QRectF(10, y, CARD_W - 20, 14))
        y += 2
        painter.setPen(QColor("#404040"))
        for text in lines[-2:]:
            y += 17
            painter.drawText(QRectF(10, y, CARD_W - 20, 18), Qt.AlignmentFlag.AlignLeft,
                             painter.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight,
                                                              int(CARD_W - 20)))

    def _paint_bar(self, painter: QPainter, r: QRectF) -> None:
        bar = self.card.memory
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor("#eeeeee"))
        painter.drawRect(r)
        if bar is None:
            return
        x = r.left()
        for attr, colour, _ in SEGMENTS:
            w = r.width() * getattr(bar, attr) / bar.total
            if w > 0:
                brush = QBrush(QColor(colour))
                if attr == "planned":
                    brush.setStyle(Qt.BrushStyle.Dense3Pattern)
                painter.setBrush(brush)
                painter.drawRect(QRectF(x, r.top(), w, r.height()))
            x += w
        if bar.overflow:  # the placement doesn't fit: the bar's end turns red
            painter.setBrush(QColor("#d03b3b"))
            painter.drawRect(QRectF(r.right() - 6, r.top() - 2, 6, r.height() + 4))
        painter.setPen(QPen(QColor("#707070"), 1))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRect(r)


class EdgeItem(QGraphicsLineItem):
    """A link: the line under the cards, its label in a box above them (`box`, added to the
    scene alongside the line)."""

    def __init__(self, edge: LinkEdge):
        super().__init__()
        self.setZValue(-1)
        self.box = QGraphicsRectItem()
        self.box.setZValue(2)
        self.box.setBrush(QColor(255, 255, 255, 230))
        self.box.setPen(QPen(QColor("#c8c8c8"), 1))
        self.label = QGraphicsSimpleTextItem(self.box)
        self.set_edge(edge)

    def set_edge(self, edge: LinkEdge) -> None:
        self.edge = edge
        rdma = edge.type == "thunderbolt-rdma"
        self.setPen(QPen(QColor("#2f7fd8" if rdma else "#707070"), 3 if rdma else 2))
        self.box.setToolTip("\n".join(edge.extra))  # why a cable carries no RDMA
        self.label.setText(edge.label)
        r = self.label.boundingRect()
        self.box.setRect(QRectF(-4, -2, r.width() + 8, r.height() + 4))

    def place(self, a: QPointF, b: QPointF) -> None:
        self.setLine(a.x(), a.y(), b.x(), b.y())
        mid = (a + b) / 2
        r = self.label.boundingRect()
        self.box.setPos(mid.x() - r.width() / 2, mid.y() - r.height() / 2)


class TopologyView(QWidget):
    """The scene plus the list of problems to fix; follows a ClusterState."""

    def __init__(self, state: ClusterState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.scene = QGraphicsScene(self)
        self.view = QGraphicsView(self.scene)
        self.view.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.view.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.cards: dict[str, NodeCardItem] = {}
        self.edges: dict[frozenset[str], EdgeItem] = {}
        self.empty = QLabel("Waiting for the node's topology…")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.legend = QLabel(" ".join(
            f'<span style="color:{colour}">■</span> {text}&nbsp;&nbsp;'
            for _, colour, text in SEGMENTS))
        self.problems = QLabel()
        self.problems.setObjectName("topologyProblems")
        self.problems.setWordWrap(True)
        self.problems.setTextFormat(Qt.TextFormat.PlainText)
        self.problems.setStyleSheet("color: #b05a00;")
        layout = QVBoxLayout(self)
        layout.addWidget(self.empty)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.problems)
        state.changed.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        cards = self.state.cards()
        self.empty.setVisible(not cards)
        if not cards:
            self.empty.setText(f"The topology is unknown: {self.state.error}"
                               if self.state.error else "Waiting for the node's topology…")
        for gone in set(self.cards) - {c.id for c in cards}:
            self.scene.removeItem(self.cards.pop(gone))
        for card in cards:
            item = self.cards.get(card.id)
            if item is None:
                item = self.cards[card.id] = NodeCardItem(card)
                self.scene.addItem(item)
            else:
                item.set_card(card)
        edges = {frozenset((e.a, e.b)): e for e in self.state.edges()
                 if e.a in self.cards and e.b in self.cards}
        for gone in set(self.edges) - set(edges):
            item = self.edges.pop(gone)
            self.scene.removeItem(item.box)
            self.scene.removeItem(item)
        for key, edge in edges.items():
            if key in self.edges:
                self.edges[key].set_edge(edge)
            else:
                item = self.edges[key] = EdgeItem(edge)
                self.scene.addItem(item)
                self.scene.addItem(item.box)
        self._layout([c.id for c in cards])
        problems = [f"{c.name}: {w}" for c in cards for w in c.warnings]
        self.problems.setText("\n".join(problems))
        self.problems.setVisible(bool(problems))

    def _layout(self, order: list[str]) -> None:
        """Cards on a circle (side by side for two), this node first; edges between."""
        n = len(order)
        # Far enough apart that a link's label fits between two cards.
        radius = 0.0 if n == 1 else max(CARD_W * (0.95 if n == 2 else 1.25),
                                        n * (CARD_W + 90) / (2 * math.pi))
        centres = {}
        for i, nid in enumerate(order):
            angle = math.pi + 2 * math.pi * i / max(n, 1)
            centre = QPointF(radius * math.cos(angle), radius * math.sin(angle) * 0.75)
            centres[nid] = centre
            self.cards[nid].setPos(centre - QPointF(CARD_W / 2, self.cards[nid].height() / 2))
        for key, item in self.edges.items():
            a, b = sorted(key)
            item.place(centres[a], centres[b])
        self.scene.setSceneRect(self.scene.itemsBoundingRect().adjusted(-20, -20, 20, 20))
        self._fit()

    def _fit(self) -> None:
        """Shrink to fit the window, never enlarge (text stays its normal size)."""
        rect = self.scene.sceneRect()
        if not self.cards or rect.isEmpty():
            return
        port = self.view.viewport().size()
        scale = min(port.width() / rect.width(), port.height() / rect.height(), 1.0)
        self.view.resetTransform()
        self.view.scale(scale, scale)
        self.view.centerOn(rect.center())

    def resizeEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt's name
        super().resizeEvent(event)
        self._fit()

    def showEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt's name
        super().showEvent(event)
        self._fit()
