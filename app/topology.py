"""The topology view: one card per machine (name, chip, OS, memory bar), one edge per
measured link (type, latency, bandwidth), and below them what needs fixing on which
machine. Cards come and go as the topology snapshots do; nothing here computes cluster
state, it draws ClusterState's cards and edges."""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsLineItem,
    QGraphicsObject,
    QGraphicsRectItem,
    QGraphicsScene,
    QGraphicsSceneMouseEvent,
    QGraphicsSimpleTextItem,
    QGraphicsView,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.cluster_state import ClusterState
from app.common import fmt_bytes
from app.link_privacy import EDGE_HINT, is_private
from app.snapshots import LinkEdge, MemoryBar, NodeCard

CARD_W, CARD_H = 250.0, 142.0  # CARD_H: the tallest card (with a badge line)
SEGMENTS = (("others", "used by other programs"), ("shoal", "used by Shoal"),
            ("planned", "planned for the selected placement"), ("free", "free"))
BADGES = {"offline": "Offline", "unpaired": "Not in this cluster",
          "mismatch": "Version mismatch"}
ADD_MACHINE = ("Add a machine",
               "Start Shoal on another Mac or Linux computer on this network and give it "
               "this cluster's secret (Settings → Cluster shows it, with a pairing code to "
               "check). It appears here by itself; across networks, add its address "
               "under Peers.")


def segment_colour(attr: str, pal: QPalette | None = None) -> QColor:
    return theme.series(0, pal) if attr == "shoal" else theme.colour(attr, pal)


def border_colour(kind: str, pal: QPalette | None = None) -> QColor:
    if kind == "unpaired":
        return theme.colour("warning", pal)
    if kind == "mismatch":
        return theme.colour("error", pal)
    return theme.muted(pal) if kind == "offline" else theme.text(pal)


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
        # every line in full: a card elides what doesn't fit its width
        tip = [*(x for x in self.lines() if x), *(x for x in (card.url,) if x),
               *card.warnings]
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
        out = [c.name + ("  (this machine)" if c.is_self else "")]
        if c.kind != "ok":
            badge = BADGES[c.kind]
            said = c.detail and c.detail.lower().startswith(badge.lower())  # not twice
            out.append(c.detail[:1].upper() + c.detail[1:] if c.detail and said else
                       f"{badge}: {c.detail}" if c.detail else badge)
        out.append(c.chip or "chip unknown")
        out.append(c.os or "")
        out.append(memory_legend(c.memory) if c.memory else
                   "no figures while it is offline" if c.kind == "offline" else
                   "memory unknown")
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

    @staticmethod
    def fonts(base: QFont) -> tuple[QFont, QFont]:
        """The title's font and the body's, from the view's."""
        title = QFont(base)
        title.setBold(True)
        title.setPointSizeF(max(title.pointSizeF(), 9.0) + 1)
        body = QFont(title)
        body.setBold(False)
        body.setPointSizeF(title.pointSizeF() - 2)
        return title, body

    def drawn_lines(self, base: QFont) -> list[str]:
        """The lines as painted in `base`'s fonts: elided ("…") where too wide."""
        title, body = self.fonts(base)
        width = int(CARD_W - 20)
        return [QFontMetrics(title if i == 0 else body).elidedText(
            text, Qt.TextElideMode.ElideRight, width) for i, text in enumerate(self.lines())]

    def paint(self, painter: QPainter, option, widget=None) -> None:  # noqa: ANN001
        c = self.card
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = theme.palette()
        pen = QPen(border_colour(c.kind, pal), 2.5 if c.is_self else 1.5)
        if c.kind in ("offline", "unpaired"):
            pen.setStyle(Qt.PenStyle.DashLine)
        painter.setPen(pen)
        painter.setBrush(theme.colour("card-unpaired" if c.kind == "unpaired" else
                                      "card-mismatch" if c.kind == "mismatch" else "card",
                                      pal))
        painter.drawRoundedRect(QRectF(0, 0, CARD_W, self.height()), 10, 10)

        lines = self.drawn_lines(painter.font())
        title, body = self.fonts(painter.font())
        painter.setFont(title)
        painter.setPen(theme.text(pal))
        painter.drawText(QRectF(10, 6, CARD_W - 20, 20), Qt.AlignmentFlag.AlignLeft,
                         lines[0])
        painter.setFont(body)
        y = 28.0
        for i, text in enumerate(lines[1:-2]):
            painter.setPen(border_colour(c.kind, pal) if (i == 0 and c.kind != "ok")
                           else theme.muted(pal))
            painter.drawText(QRectF(10, y, CARD_W - 20, 18), Qt.AlignmentFlag.AlignLeft, text)
            y += 17
        y += 5
        self._paint_bar(painter, QRectF(10, y, CARD_W - 20, 14))
        y += 2
        painter.setPen(theme.muted(pal))
        for text in lines[-2:]:
            y += 17
            painter.drawText(QRectF(10, y, CARD_W - 20, 18), Qt.AlignmentFlag.AlignLeft, text)

    def _paint_bar(self, painter: QPainter, r: QRectF) -> None:
        bar = self.card.memory
        pal = theme.palette()
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(theme.colour("track", pal))
        painter.drawRect(r)
        if bar is None:
            return
        x = r.left()
        for attr, _ in SEGMENTS:
            w = r.width() * getattr(bar, attr) / bar.total
            if w > 0:
                brush = QBrush(segment_colour(attr, pal))
                if attr == "planned":
                    brush.setStyle(Qt.BrushStyle.Dense3Pattern)
                painter.setBrush(brush)
                painter.drawRect(QRectF(x, r.top(), w, r.height()))
            x += w
        if bar.overflow:  # the placement doesn't fit: the bar's end turns red
            painter.setBrush(theme.colour("error", pal))
            painter.drawRect(QRectF(r.right() - 6, r.top() - 2, 6, r.height() + 4))
        painter.setPen(QPen(theme.muted(pal), 1))
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
        self.label = QGraphicsSimpleTextItem(self.box)
        self.set_edge(edge)

    def set_edge(self, edge: LinkEdge) -> None:
        self.edge = edge
        rdma = edge.type == "thunderbolt-rdma"
        pal = theme.palette()
        self.setPen(QPen(theme.series(0, pal) if rdma else theme.muted(pal), 3 if rdma else 2))
        base = pal.color(QPalette.ColorRole.Base)
        base.setAlpha(235)
        self.box.setBrush(base)
        self.box.setPen(QPen(pal.color(QPalette.ColorRole.Mid), 1))
        self.label.setBrush(theme.text(pal))
        # why a cable carries no RDMA; on a shared network, what crosses it unencrypted
        hint = () if is_private(edge.type) else (EDGE_HINT,)
        self.box.setToolTip("\n".join(edge.extra + hint))
        self.label.setText(edge.label)
        r = self.label.boundingRect()
        self.box.setRect(QRectF(-4, -2, r.width() + 8, r.height() + 4))

    def place(self, a: QPointF, b: QPointF) -> None:
        self.setLine(a.x(), a.y(), b.x(), b.y())
        mid = (a + b) / 2
        r = self.label.boundingRect()
        self.box.setPos(mid.x() - r.width() / 2, mid.y() - r.height() / 2)


class AddMachineItem(QGraphicsObject):
    """A dashed card beside a lone machine: how to add another (a click opens Settings)."""

    clicked = Signal()
    H = 150.0

    def __init__(self):
        super().__init__()
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip("Open Settings → Cluster")

    def boundingRect(self) -> QRectF:  # noqa: N802 - Qt's name
        return QRectF(-2, -2, CARD_W + 4, self.H + 4)

    def paint(self, painter: QPainter, option, widget=None) -> None:  # noqa: ANN001
        pal = theme.palette()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pen = QPen(theme.muted(pal), 1.5)
        pen.setStyle(Qt.PenStyle.DashLine)
        painter.setPen(pen)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(QRectF(0, 0, CARD_W, self.H), 10, 10)
        title = QFont(painter.font())
        title.setBold(True)
        painter.setFont(title)
        painter.setPen(theme.text(pal))
        painter.drawText(QRectF(10, 6, CARD_W - 20, 20), Qt.AlignmentFlag.AlignLeft,
                         "+ " + ADD_MACHINE[0])
        body = QFont(painter.font())
        body.setBold(False)
        body.setPointSizeF(max(body.pointSizeF() - 1, 7.0))
        painter.setFont(body)
        painter.setPen(theme.muted(pal))
        painter.drawText(QRectF(10, 28, CARD_W - 20, self.H - 34),
                         Qt.TextFlag.TextWordWrap | Qt.AlignmentFlag.AlignLeft, ADD_MACHINE[1])

    def mousePressEvent(self, event: QGraphicsSceneMouseEvent) -> None:  # noqa: N802
        self.clicked.emit()
        event.accept()


class TopologyView(QWidget):
    """The scene plus the list of problems to fix; follows a ClusterState.
    add_machine_requested: the user wants to pair another machine (open Settings)."""

    add_machine_requested = Signal()

    def __init__(self, state: ClusterState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.scene = QGraphicsScene(self)
        self.view = QGraphicsView(self.scene)
        # the view shrinks when the problems below it appear: fit the cards again then
        self.view.viewport().installEventFilter(self)
        self.view.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.view.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.view.setAccessibleName("Machines and links")
        self.cards: dict[str, NodeCardItem] = {}
        self.edges: dict[frozenset[str], EdgeItem] = {}
        self.add_card = AddMachineItem()
        self.add_card.clicked.connect(self.add_machine_requested)
        self.add_card.hide()
        self.scene.addItem(self.add_card)
        self.empty = QLabel("Waiting for the node's topology…")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.legend = QLabel()
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.add_button = QPushButton("Add a machine…")
        self.add_button.setToolTip(ADD_MACHINE[1])
        self.add_button.setAccessibleName("Add a machine")
        self.add_button.clicked.connect(self.add_machine_requested)
        self.problems = QLabel()
        self.problems.setObjectName("topologyProblems")
        self.problems.setWordWrap(True)
        self.problems.setTextFormat(Qt.TextFormat.PlainText)
        theme.set_role(self.problems, "warning")
        foot = QHBoxLayout()
        foot.addWidget(self.legend, 1)
        foot.addWidget(self.add_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.empty)
        layout.addWidget(self.view, 1)
        layout.addLayout(foot)
        layout.addWidget(self.problems)
        state.changed.connect(self.refresh)
        self._legend()
        self.refresh()

    def _legend(self) -> None:
        pal = self.palette()
        self.legend.setText(" ".join(
            f'<span style="color:{segment_colour(attr, pal).name()}">■</span> '
            f'{text}&nbsp;&nbsp;' for attr, text in SEGMENTS))

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._legend()
            for edge in self.edges.values():
                edge.set_edge(edge.edge)
            self.scene.update()

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
        self.add_card.setVisible(sum(c.usable for c in cards) == 1)
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
        if self.add_card.isVisible():  # beside the cards, on the right
            right = max((c.x() + CARD_W for c in self.cards.values()), default=0.0)
            self.add_card.setPos(right + 60, -AddMachineItem.H / 2)
        shown = [i.sceneBoundingRect() for i in self.scene.items() if i.isVisible()]
        rect = QRectF()
        for r in shown:
            rect = rect.united(r)
        self.scene.setSceneRect(rect.adjusted(-20, -20, 20, 20))
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

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's
        if watched is self.view.viewport() and event.type() == QEvent.Type.Resize:
            self._fit()
        return False

    def showEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt's name
        super().showEvent(event)
        self._fit()
