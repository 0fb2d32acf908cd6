"""The placement view: for a model and a context length, which nodes hold which layers,
what that needs in memory per node, and how fast it would run, as the planner predicts.

Every number comes from the node's planner (POST /shoal/plan): the best placement, an
automatic split for a chosen set of nodes, or the prediction for the exact layout the user
dragged. Requests run off the GUI thread, are debounced while dragging, and a late answer
never overwrites a newer one.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.cluster_state import ClusterState
from app.common import buddy, fmt_bytes, fmt_tps, message_of
from app.first_token import split_text, ttft_text
from app.kv_choice import KVBox, KVOffer
from app.launch import LaunchPanel
from app.strips import LayerStrips
from app.tasks import Tasks
from app.users_verdict import UsersVerdict
from engine.client import NodeClient
from engine.cluster_records import PlanInfo
from engine.records import ModelCard, ModelFacts

log = logging.getLogger(__name__)
DEBOUNCE_MS = 120
STRATEGIES = (("pipeline", "Split by layers (each machine holds some of them)"),
              ("tensor", "Share every layer (each machine holds part of each)"))
BACKENDS = (("ring", "Ring (TCP)"), ("jaccl", "RDMA (jaccl, Thunderbolt 5)"))


def merge_notes(notes: list[str]) -> list[str]:
    """The planner's notes, one per node ("a: no figures for chip X"), said once for all
    the nodes they apply to ("a, b: no figures for chip X")."""
    by_text: dict[str, list[str]] = {}
    for note in notes:
        who, sep, text = note.partition(": ")
        if not sep or " " in who:
            who, text = "", note
        names = by_text.setdefault(text, [])
        if who and who not in names:
            names.append(who)
    return [f"{', '.join(names)}: {text}" if names else text
            for text, names in by_text.items()]


class PlacementView(QWidget):
    """`prediction` holds the planner's last answer for the layout shown (None when it
    can't run: `reason` says why); `last_request` is what was last asked."""

    prediction_changed = Signal()

    def __init__(self, client: NodeClient, tasks: Tasks, state: ClusterState,
                 logs_dir: Any = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.tasks, self.state = client, tasks, state
        self.models: dict[str, ModelFacts] = {}
        self.node_ids: list[str] = []  # rank order: this node first
        self.ranges: list[tuple[int, int]] = []
        self.layers = 0
        self.prediction: dict[str, Any] | None = None
        self.running = False  # the placement shown is the one running now
        self.reason: str | None = None
        self.last_request: dict[str, Any] | None = None
        self._seq = 0  # newest request sent
        self._busy = False
        self._again: tuple[dict[str, Any], bool] | None = None  # waits for the one in flight
        self._best_pending = False
        self._is_best = False  # the layout shown is the planner's own choice
        self.measured: dict[str, float] = {}  # model -> decode tokens/s its last reply had
        self._known: tuple[Any, ...] = ()  # nodes, whether memory is known, their speed
        self._build(logs_dir)
        state.changed.connect(self._follow_cluster)

    # --- layout ---------------------------------------------------------------------------
    def _build(self, logs_dir: Any) -> None:
        self.model_box = QComboBox()
        self.model_box.setMinimumContentsLength(20)
        self.model_box.currentTextChanged.connect(self._model_changed)
        self.context_spin = QSpinBox()
        self.context_spin.setRange(256, 1_048_576)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setSuffix(" tokens")
        self.context_spin.setValue(4096)
        self.context_spin.editingFinished.connect(self._context_edited)
        self._context_chosen = False  # else the planner's default for the model
        self.kv_box = KVBox()
        self.kv_box.currentIndexChanged.connect(lambda _i: self.request(True))
        self.kv_offer = KVOffer(self.client, self.tasks)
        self.kv_offer.chosen.connect(self.kv_box.choose)
        self.strategy_box = QComboBox()
        for key, text in STRATEGIES:
            self.strategy_box.addItem(text, key)
        self.strategy_box.currentIndexChanged.connect(lambda _i: self.request(False))
        self.backend_box = QComboBox()
        for key, text in BACKENDS:
            self.backend_box.addItem(text, key)
        self.backend_box.currentIndexChanged.connect(lambda _i: self.request(True))
        self.best_button = QPushButton("Planner's best")
        self.best_button.setToolTip("Ask the planner for the fastest placement that "
                                    "includes this machine")
        self.best_button.clicked.connect(self.best)
        self.rank_box = QComboBox()
        self.rank_box.addItem("for chat", "chat")
        self.rank_box.addItem("for agents", "agents")
        self.rank_box.setToolTip("For chat: the fastest decode. For agents: the shortest "
                                 "wait for the first token of a long prompt.")
        self.rank_box.setAccessibleName("Best placement for")
        self.rank_box.currentIndexChanged.connect(lambda _i: self.best())
        self.node_list = QListWidget()
        self.node_list.setFixedHeight(28)
        self.node_list.itemChanged.connect(self._nodes_edited)

        for w, name in ((self.model_box, "Model"), (self.context_spin, "Context length"),
                        (self.strategy_box, "Strategy"), (self.backend_box, "Backend"),
                        (self.node_list, "Nodes")):
            w.setAccessibleName(name)
        form = QFormLayout()
        row = QHBoxLayout()
        row.addWidget(self.model_box, 1)
        row.addWidget(buddy("Con&text:", self.context_spin))
        row.addWidget(self.context_spin)
        row.addWidget(buddy("&KV cache:", self.kv_box))
        row.addWidget(self.kv_box)
        form.addRow(buddy("&Model:", self.model_box), row)
        row = QHBoxLayout()
        row.addWidget(self.strategy_box, 1)
        row.addWidget(buddy("&Backend:", self.backend_box))
        row.addWidget(self.backend_box, 1)
        row.addWidget(self.best_button)
        row.addWidget(self.rank_box)
        form.addRow(buddy("St&rategy:", self.strategy_box), row)
        form.addRow("&Nodes:", self.node_list)

        self.strips = LayerStrips()
        self.strips.ranges_changed.connect(self._dragged)
        self.headline = QLabel("Choose a model")
        self.headline.setObjectName("prediction")
        self.headline.setWordWrap(True)
        theme.set_role(self.headline, "headline")
        self.ttft_label = QLabel()
        self.ttft_label.setObjectName("ttft")
        self.ttft_label.setWordWrap(True)
        self.split_label = QLabel()  # another machine prefilling long prompts for it
        self.split_label.setObjectName("splitPrefill")
        self.split_label.setWordWrap(True)
        self.split_label.hide()
        self.users_verdict = UsersVerdict(self.client, self.tasks)
        self.measured_label = QLabel()
        self.measured_label.setObjectName("measured")
        self.measured_label.setWordWrap(True)
        self.measured_label.hide()
        self.reason_label = QLabel()
        self.reason_label.setObjectName("placementReason")
        self.reason_label.setWordWrap(True)
        theme.set_role(self.reason_label, "error-strong")
        self.reason_label.hide()
        self.notes = QLabel()
        self.notes.setWordWrap(True)
        theme.set_role(self.notes, "muted")
        self.table = QTableWidget(0, 6)
        self.table.setHorizontalHeaderLabels(["Machine", "Layers", "Weights", "KV cache",
                                              "Total / usable", "Fits"])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setMaximumHeight(130)
        self.table.setAccessibleName("Memory per machine")
        self.launch = LaunchPanel(self.client, self.tasks, self.state, logs_dir)

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(QLabel("Drag the boundary between two machines to move layers:"))
        layout.addWidget(self.strips)
        layout.addWidget(self.headline)
        layout.addWidget(self.ttft_label)
        layout.addWidget(self.split_label)
        layout.addWidget(self.users_verdict)
        layout.addWidget(self.measured_label)
        layout.addWidget(self.reason_label)
        layout.addWidget(self.kv_offer)
        layout.addWidget(self.table)
        layout.addWidget(self.notes)
        layout.addWidget(self.launch)
        layout.addStretch(1)
        self._debounce = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self._debounce.timeout.connect(lambda: self.request(keep_ranges=True))

    # --- inputs ---------------------------------------------------------------------------
    @property
    def model(self) -> str:
        return self.model_box.currentText().strip()

    @property
    def strategy(self) -> str:
        return self.strategy_box.currentData()

    @property
    def backend(self) -> str:
        return self.backend_box.currentData()

    def set_models(self, models: list[ModelCard]) -> None:
        """The models this node can plan (GET /v1/models)."""
        current = self.model
        self.models = {m.id: m.shoal for m in models}
        self.model_box.blockSignals(True)
        self.model_box.clear()
        self.model_box.addItems(list(self.models))
        self.model_box.blockSignals(False)
        if current in self.models:
            self.model_box.setCurrentText(current)
        elif self.models:
            self.best()

    def choose_model(self, model: str) -> None:
        if self.model_box.findText(model) < 0:
            self.model_box.addItem(model)
        self.model_box.setCurrentText(model)

    def refresh_models(self) -> None:
        self.tasks.run(self.client.models, on_done=self.set_models,
                       on_error=lambda e: self._show_reason(
                           f"Couldn't list models: {message_of(e)}"), owner=self)

    def _follow_cluster(self) -> None:
        """Keep the node list in step with the cluster (new, gone and unusable nodes)."""
        usable = [c for c in self.state.cards() if c.usable]
        ids = [c.id for c in usable]
        known = {self.node_list.item(i).data(Qt.ItemDataRole.UserRole): self.node_list.item(i)
                 for i in range(self.node_list.count())}
        if set(ids) != set(known):
            checked = set(self.node_ids)
            self.node_list.blockSignals(True)
            self.node_list.clear()
            for c in usable:
                item = QListWidgetItem(c.name + ("  (this machine: it answers the chat)"
                                                  if c.is_self else ""))
                item.setData(Qt.ItemDataRole.UserRole, c.id)
                if c.is_self:  # the app's node holds rank 0 and serves the chat
                    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsUserCheckable)
                    item.setCheckState(Qt.CheckState.Checked)
                else:
                    item.setCheckState(Qt.CheckState.Checked if c.id in checked or not
                                       self.node_ids else Qt.CheckState.Unchecked)
                self.node_list.addItem(item)
            self.node_list.blockSignals(False)
            self.node_list.setFixedHeight(min(6 + 22 * max(len(usable), 1), 160))
            gone = [n for n in self.node_ids if n not in ids]
            if gone and self.model:
                self._nodes_edited()
        self._update_backends()
        if self.node_ids:
            self.strips.set_layout(self._names(), self.ranges, self.layers, self.strategy)
        if self._best_pending and self.state.self_id is not None:
            self.best()
        # What the planner's figures rest on changed: a node came or went, reported its
        # memory, or finished measuring its speed (a plan made before is wrong by 20x).
        known = tuple((c.id, c.memory is not None, c.speed) for c in usable)
        if known != self._known and self.model and not self._best_pending:
            if self.node_ids and self.prediction is not None and not self._is_best:
                self.request(keep_ranges=True)
            else:
                self.best()
        self._known = known
        if self.prediction is not None:  # a model that started or stopped since
            running = self._is_running(self.prediction["ranks"])
            if running != self.running:
                self.running = running
                self.state.set_planned({} if running else {
                    r["node"]: int(r["memory"]["total"]) for r in self.prediction["ranks"]})
                self._show_measured()

    def _update_backends(self) -> None:
        cards = {c.id: c for c in self.state.cards()}
        chosen = [cards[n] for n in self._checked() if n in cards]
        rdma = len(chosen) > 1 and all(c.rdma for c in chosen)
        item = self.backend_box.model().item(1)
        item.setEnabled(rdma)
        item.setToolTip("" if rdma else "Needs every chosen machine on Thunderbolt 5 with RDMA "
                        "enabled (see the topology view)")
        if not rdma and self.backend == "jaccl":
            self.backend_box.setCurrentIndex(0)

    def _checked(self) -> list[str]:
        out = []
        for i in range(self.node_list.count()):
            item = self.node_list.item(i)
            if item.checkState() == Qt.CheckState.Checked:
                out.append(item.data(Qt.ItemDataRole.UserRole))
        return out

    def _names(self) -> list[str]:
        return [self.state.node_name(n) for n in self.node_ids]

    def _nodes_edited(self, _item: QListWidgetItem | None = None) -> None:
        self._update_backends()
        self.request(keep_ranges=False)

    def _model_changed(self, _model: str) -> None:
        self._context_chosen = False
        self.best()

    def _context_edited(self) -> None:
        self._context_chosen = True
        self.request(keep_ranges=True)

    def _dragged(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges = list(ranges)
        self._debounce.start()

    # --- asking the planner ---------------------------------------------------------------
    def best(self) -> None:
        """The running placement of this model, else the placement a launch without nodes
        would take (the node's "best"), else the planner's split over the checked nodes."""
        if not self.model:
            return
        if self.state.self_id is None:  # the cluster isn't known yet: ask once it is
            self._best_pending = True
            return
        self._best_pending = False
        facts = self.models.get(self.model)
        self.layers = facts.layers or 0 if facts is not None else 0
        own = self.state.own_instance()
        if own is not None and own.get("model") == self.model and own.get("ranks"):
            pipeline = own.get("strategy") == "pipeline"
            self._send({"model": self.model, "context": None,
                        "strategy": own.get("strategy"), "backend": "ring",
                        "nodes": [{"node": r["node"],
                                   **({"layers": r["layers"]} if pipeline else {})}
                                  for r in own["ranks"]]})
            return
        context = self.context_spin.value() if self._context_chosen else None
        self._send({"model": self.model, "context": context}, best=True)

    def request(self, keep_ranges: bool = True) -> None:
        """Ask for the layout shown: the dragged ranges (keep_ranges) or the planner's split
        of the checked nodes."""
        if not self.model:
            return
        nodes = self._checked()
        keep = (keep_ranges and self.strategy == "pipeline" and nodes == self.node_ids
                and len(self.ranges) == len(nodes))
        entries = [{"node": n, **({"layers": list(r)} if keep else {})}
                   for n, r in zip(nodes, self.ranges if keep else [None] * len(nodes))]
        self._send({"model": self.model, "context": self.context_spin.value(),
                    "strategy": self.strategy, "backend": self.backend, "nodes": entries})

    def _send(self, body: dict[str, Any], best: bool = False) -> None:
        if self._busy:  # one request at a time; only the newest waiting one is sent
            self._again = (body, best)
            return
        self._busy = True
        self._seq += 1
        seq = self._seq
        self.last_request = body
        self._is_best = best
        self.tasks.run(self.client.plan, body["model"], body.get("context"),
                       body.get("strategy"), body.get("nodes"), body.get("backend"),
                       kv_bits=self.kv_box.bits, rank=self.rank_box.currentData(),
                       on_done=lambda r: self._answered(seq, body, r, None, best),
                       on_error=lambda e: self._answered(seq, body, None, e, best), owner=self)

    def _answered(self, seq: int, body: dict[str, Any], report: PlanInfo | None,
                  error: BaseException | None, best: bool) -> None:
        self._busy = False
        if self._again is not None:
            again, self._again = self._again, None
            self._send(*again)
            return  # a newer question is on its way; this answer is already stale
        if error is not None or report is None:
            self._infeasible(message_of(error) if error else "The node gave no plan.", body,
                             memory=getattr(error, "code", None) == "insufficient_memory")
            return
        self.kv_offer.clear()
        self.kv_box.set_default(report.kv_bits)
        self._grey_strategies(report.strategies)
        placements = report.placements
        if best:  # the node's one rule for its best placement (engine.node.planning)
            if report.best is None:  # nothing the ring can run: split the checked
                self.request(keep_ranges=False)
                return
            placements = [placements[report.best]]
        self._show(report, placements[0].to_json())  # the view keeps the JSON it shows

    # --- showing the answer ---------------------------------------------------------------
    def _show(self, report: PlanInfo, placement: dict[str, Any]) -> None:
        ranks = placement["ranks"]
        self.prediction, self.reason = placement, None
        self.node_ids = [r["node"] for r in ranks]
        self.layers = max(r["layers"][1] for r in ranks)
        self.ranges = [tuple(r["layers"]) for r in ranks]
        strategy = "tensor" if placement["strategy"] == "tensor" else "pipeline"
        for box, value in ((self.strategy_box, strategy), (self.backend_box,
                                                            placement["backend"])):
            box.blockSignals(True)
            box.setCurrentIndex(max(box.findData(value), 0))
            box.blockSignals(False)
        self.context_spin.blockSignals(True)
        self.context_spin.setValue(int(report.context or self.context_spin.value()))
        self.context_spin.blockSignals(False)
        self._check_nodes(self.node_ids)
        self.strips.set_layout(self._names(), self.ranges, self.layers, self.strategy)
        self.strips.set_feasible(True)
        self.headline.setText(
            f"Predicted: {fmt_tps(placement['decode_tps'])} tokens/s decode · "
            f"{fmt_tps(placement['prefill_tps'])} tokens/s prefill"
            + (f" · {fmt_tps(full)} tokens/s at full context"
               if (full := placement.get("decode_tps_full_context")) and
               abs(full - placement["decode_tps"]) > 0.01 * placement["decode_tps"] else "")
            + (f" · {fmt_tps(many)} tokens/s over {placement.get('streams')} streams"
               + (f", {lanes} batches in flight" if (lanes := placement.get("lanes") or 1)
                  > 1 else "")
               if (many := placement.get("decode_tps_streams")) else "")
            + (f" · {fmt_tps(drafted)} tokens/s with drafts"
               if (drafted := placement.get("decode_tps_drafted") or 0)
               > 1.01 * placement["decode_tps"] else "")
            + (f" · at most {joules:.2g} J/token" if (joules := placement.get(
                "decode_j_per_token")) else ""))
        self.ttft_label.setText(ttft_text(placement.get("ttft") or []))
        self.split_label.setText(split_text(placement))
        self.split_label.setVisible(bool(self.split_label.text()))
        self.users_verdict.ask(self.model, report.context or None, self.kv_box.bits)
        self.reason_label.setVisible(bool(placement.get("warnings")))
        self.reason_label.setText("\n".join(placement.get("warnings") or []))
        self._fill_table(ranks)
        self.notes.setText("\n".join(f"Note: {n}" for n in merge_notes(
            report.notes)))
        self.running = self._is_running(ranks)
        self._show_measured()
        # What already runs is in use, not planned (the memory bars show it once).
        self.state.set_planned({} if self.running else
                               {r["node"]: int(r["memory"]["total"]) for r in ranks})
        self.launch.set_placement(self.model, self.strategy, self.backend,
                                  [(r["node"], tuple(r["layers"])) for r in ranks],
                                  self.kv_box.bits,
                                  (placement["prefill"], placement.get("prefill_min"))
                                  if placement.get("prefill") else None)
        self.prediction_changed.emit()

    def _is_running(self, ranks: list[dict[str, Any]]) -> bool:
        """Is this placement the one running now: the instance this node owns, or the
        model this node's own worker has loaded?"""
        own = self.state.own_instance()
        if own is not None:
            return own.get("model") == self.model and [
                (r["node"], r.get("layers")) for r in own.get("ranks") or []] == [
                (r["node"], r["layers"]) for r in ranks]
        runner = self.state.status.get("runner") or {}
        return (runner.get("type") == "Ready" and runner.get("model") == self.model
                and [r["node"] for r in ranks] == [self.state.self_id])

    def set_measured(self, stats: dict[str, Any]) -> None:
        """A finished reply's figures (ChatPane.reply_finished): shown beside the
        prediction when they are the running placement's."""
        model, tps = stats.get("model"), stats.get("generation_tps")
        if model and tps:
            self.measured[str(model)] = float(tps)
            self._show_measured()

    def _show_measured(self) -> None:
        tps = self.measured.get(self.model)
        shown = self.prediction is not None and getattr(self, "running", False)
        if shown and tps is not None:
            predicted = self.prediction["decode_tps"]
            self.measured_label.setText(
                f"Running now · measured {fmt_tps(tps)} tokens/s decode on the last reply "
                f"(predicted {fmt_tps(predicted)})")
        elif shown:
            self.measured_label.setText("Running now · send a message in Chat to measure "
                                        "its speed")
        self.measured_label.setVisible(shown)

    def _check_nodes(self, ids: list[str]) -> None:
        self.node_list.blockSignals(True)
        for i in range(self.node_list.count()):
            item = self.node_list.item(i)
            if item.flags() & Qt.ItemFlag.ItemIsUserCheckable:
                item.setCheckState(Qt.CheckState.Checked
                                   if item.data(Qt.ItemDataRole.UserRole) in ids
                                   else Qt.CheckState.Unchecked)
        self.node_list.blockSignals(False)
        self._update_backends()

    def _fill_table(self, ranks: list[dict[str, Any]]) -> None:
        self.table.setRowCount(len(ranks))
        for i, r in enumerate(ranks):
            mem = r["memory"]
            fits = mem["total"] <= mem["usable"]
            s, e = r["layers"]
            layers = (f"1/{len(ranks)} of all {e}" if self.strategy == "tensor" and
                      len(ranks) > 1 else f"{s}–{e - 1}" if e > s + 1 else
                      str(s) if e > s else "none")
            cells = [self.state.node_name(r["node"]), layers, fmt_bytes(mem["weights"]),
                     fmt_bytes(mem["kv_cache"]),
                     f"{fmt_bytes(mem['total'])} / {fmt_bytes(mem['usable'])}",
                     "yes" if fits else "NO"]
            for j, text in enumerate(cells):
                cell = QTableWidgetItem(text)
                if not fits:
                    cell.setForeground(theme.colour("error"))
                self.table.setItem(i, j, cell)

    def _grey_strategies(self, refused: dict[str, str | None]) -> None:
        """Strategies this model's family can't run are greyed, with the reason."""
        items = self.strategy_box.model()
        for i in range(self.strategy_box.count()):
            why = refused.get(self.strategy_box.itemData(i))
            items.item(i).setEnabled(not why)
            items.item(i).setToolTip(why or "")

    def _infeasible(self, reason: str, body: dict[str, Any], memory: bool = False) -> None:
        """The layout can't run: red strips, the planner's reason, nothing to launch; or
        where only memory is short, "Launch anyway" with the risk said."""
        self.prediction, self.reason = None, reason
        nodes = body.get("nodes") or []
        if nodes and all("layers" in n for n in nodes):
            self.node_ids = [n["node"] for n in nodes]
            self.ranges = [tuple(n["layers"]) for n in nodes]
        elif nodes and body.get("strategy") == "tensor":
            self.node_ids = [n["node"] for n in nodes]
            self.ranges = [(0, self.layers)] * len(nodes)
        self.strips.set_layout(self._names(), self.ranges, self.layers, self.strategy)
        self.strips.set_feasible(False)
        self.headline.setText("This placement can't run")
        self.split_label.hide()
        self.users_verdict.ask(self.model, body.get("context"), self.kv_box.bits)
        self._show_reason(reason.removeprefix("This placement can't run: "))
        self.table.setRowCount(0)
        self.running = False
        self._show_measured()
        self.state.set_planned({})
        self.launch.set_placement(None)
        if memory and self.model and len(self.node_ids) == len(self.ranges):
            self.launch.offer_anyway(self.model, self.strategy, self.backend,
                                     list(zip(self.node_ids, self.ranges, strict=True)),
                                     "The memory check refuses this placement.",
                                     self.kv_box.bits)
        if memory and self.kv_box.bits in (None, 16) and body.get("strategy"):
            self.kv_offer.probe(body, int(body.get("context") or self.context_spin.value()))
        else:
            self.kv_offer.clear()
        self.prediction_changed.emit()

    def _show_reason(self, text: str) -> None:
        self.reason_label.setText(text)
        self.reason_label.show()
