"""Launch and Stop for the placement shown: per-node loading progress, then Ready; a
failed launch names the node and why, with the log one click away.

Progress comes from the snapshots ClusterState already polls (polled faster while a
launch runs): this node's runner reports layers loaded / total, the other nodes report
their rank's state. Above the buttons, where the placement's machines share an Ethernet
or Wi-Fi network, a note says what crosses it unencrypted (app/link_privacy.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.catalog import spread
from app.cluster_state import TOPOLOGY_EVERY_S, ClusterState
from app.common import buddy, message_of
from app.link_privacy import NOTE, detail, shared_links
from app.logs import LogDialog
from app.replicas_view import ReplicasView
from app.tasks import Tasks
from engine.client import NodeClient
from engine.records import InstanceInfo, LaunchedReplicas
from engine.words import joined

log = logging.getLogger(__name__)
LAUNCH_POLL_S = 0.5
MAX_COPIES = 16  # what the node accepts as "replicas"


class NodeProgress(QWidget):
    def __init__(self, name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.name = QLabel(name)
        self.name.setMinimumWidth(140)
        self.bar = QProgressBar()
        self.bar.setRange(0, 100)
        self.bar.setValue(0)
        self.text = QLabel("Waiting")
        self.text.setMinimumWidth(200)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.name)
        row.addWidget(self.bar, 1)
        row.addWidget(self.text)

    def show_state(self, text: str, done: int | None, total: int | None,
                   failed: bool = False) -> None:
        self.text.setText(text)
        theme.set_role(self.text, "error" if failed else None)
        if total:
            self.bar.setRange(0, total)
            self.bar.setValue(done or 0)
        elif done is None:
            self.bar.setRange(0, 0)  # busy: the node doesn't report layers
        else:
            self.bar.setRange(0, 1)
            self.bar.setValue(done)


RISK = ("Launching anyway risks swapping, or on a Mac the machine freezing, while it "
        "loads; once it runs, requests that don't fit are refused.")


def _stop_all(client: NodeClient, ids: list[str], unload: bool) -> None:
    """Stop copies launched together (on a worker thread): each group by its id, the one
    alone on this machine by unloading it; a failure is raised once all were asked."""
    failed: Exception | None = None
    for instance_id in ids:
        try:
            client.stop_instance(instance_id)
        except Exception as e:  # noqa: BLE001 - the other copies are still stopped
            failed = failed or e
    if unload:
        try:
            client.unload()
        except Exception as e:  # noqa: BLE001
            failed = failed or e
    if failed is not None:
        raise failed


def _how(strategy: str, machines: int) -> str:
    """How one copy over several machines runs ("" on one)."""
    return "" if machines <= 1 else ", " + spread(strategy, machines).split(", ", 1)[1]


class LaunchPanel(QWidget):
    """state_text: "", "Launching…", "Ready", "Failed", "Stopped" (tests wait on it)."""

    launched = Signal(object)  # the InstanceInfo launched (LaunchedReplicas: copies)

    def __init__(self, client: NodeClient, tasks: Tasks, state: ClusterState,
                 logs_dir: Path | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.client, self.tasks, self.state = client, tasks, state
        self.logs_dir = Path(logs_dir) if logs_dir else None
        self.placement: tuple[str, str, str, list[tuple[str, tuple[int, int]]]] | None = None
        self.kv_bits: int | None = None  # the KV cache's bits (None: the node's setting)
        self.prefill: tuple[str, int | None] | None = None  # the planner's prefill node
        # the instance this node owns, as JSON: launched here or seen in the topology
        self.instance: dict[str, Any] | None = None
        self.launching: dict[str, Any] | None = None
        self.failed_node: str | None = None
        self.state_text = ""
        self.rows: dict[str, NodeProgress] = {}
        self.copies: list[dict[str, Any]] = []  # each copy launched, as JSON (2 or more)
        self.log_dialog: LogDialog | None = None

        self.launch_button = QPushButton("Launch")
        self.launch_button.setAccessibleName("Launch this placement")
        self.launch_button.setEnabled(False)
        self.launch_button.clicked.connect(self.start)
        # copies of the model, each on machines of its own; requests are shared out
        self.copies_spin = QSpinBox()
        self.copies_spin.setRange(1, MAX_COPIES)
        self.copies_spin.setValue(1)
        self.copies_spin.setAccessibleName("Copies of the model to run")
        self.copies_spin.setToolTip("Run this many copies of the model, each on machines "
                                    "of its own; requests are shared between them, so more "
                                    "people can use it at once.")
        # where the memory check refused it: launch anyway, the risk said (tests click it)
        self.force_button = QPushButton("Launch anyway")
        self.force_button.setAccessibleName("Launch this placement although it may not fit")
        self.force_button.hide()
        self.force_button.clicked.connect(lambda: self.start(force=True))
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop the running model")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        self.headline = QLabel()
        self.headline.setObjectName("launchState")
        self.headline.setWordWrap(True)
        # after a node was lost: what the owner did about it, and, once the node is back,
        # the original placement to run again (engine/node/healing.py)
        self.heal_label = QLabel()
        self.heal_label.setObjectName("healing")
        self.heal_label.setWordWrap(True)
        self.heal_label.hide()
        self.restore_button = QPushButton("Use my split again")
        self.restore_button.setAccessibleName("Launch the placement that ran before a "
                                              "machine was lost")
        self.restore_button.hide()
        self.restore_button.clicked.connect(self.restore)
        self.log_button = QPushButton("Show log")
        self.log_button.hide()
        self.log_button.clicked.connect(self.show_log)
        # where the placement's machines share an Ethernet or Wi-Fi link: what crosses it
        # unencrypted (app/link_privacy.py decides)
        self.privacy = QLabel(NOTE)
        self.privacy.setObjectName("linkPrivacy")
        self.privacy.setWordWrap(True)
        theme.set_role(self.privacy, "warning")
        self.privacy_detail = QLabel()
        self.privacy_detail.setObjectName("linkPrivacyDetail")
        self.privacy_detail.setWordWrap(True)
        theme.set_role(self.privacy_detail, "muted")
        self.privacy.hide()
        self.privacy_detail.hide()
        self.grid = QGridLayout()
        buttons = QHBoxLayout()
        buttons.addWidget(buddy("Co&pies:", self.copies_spin))
        buttons.addWidget(self.copies_spin)
        buttons.addWidget(self.launch_button)
        buttons.addWidget(self.force_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.headline, 1)
        buttons.addWidget(self.log_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.privacy)
        layout.addWidget(self.privacy_detail)
        layout.addLayout(buttons)
        heal = QHBoxLayout()
        heal.addWidget(self.heal_label, 1)
        heal.addWidget(self.restore_button)
        layout.addLayout(heal)
        layout.addLayout(self.grid)
        self.replicas = ReplicasView(client, tasks, state.node_name, parent=self)
        layout.addWidget(self.replicas)
        self.replicas.start()
        state.changed.connect(self._follow)

    def set_placement(self, model: str | None, strategy: str = "pipeline",
                      backend: str = "ring",
                      ranks: list[tuple[str, tuple[int, int]]] | None = None,
                      kv_bits: int | None = None,
                      prefill: tuple[str, int | None] | None = None) -> None:
        """What Launch would start (None: the shown placement can't run); `prefill`: the
        node the planner has prefill its long prompts, and from how many tokens."""
        self.placement = (model, strategy, backend, ranks or []) if model else None
        self.kv_bits = kv_bits
        self.prefill = prefill
        self._buttons()
        self._show_privacy()

    def offer_anyway(self, model: str, strategy: str, backend: str,
                     ranks: list[tuple[str, tuple[int, int]]], reason: str,
                     kv_bits: int | None = None) -> None:
        """The memory check refuses this placement: it can still be launched, the risk
        said first."""
        self.placement = (model, strategy, backend, ranks)
        self.kv_bits = kv_bits
        self.prefill = None
        self._buttons()
        self._show_privacy()
        self.launch_button.setEnabled(False)
        self.force_button.show()
        self._set_headline("", f"{reason} {RISK}", error=True)

    def _buttons(self) -> None:
        self.launch_button.setEnabled(self.placement is not None and self.launching is None)
        self.stop_button.setEnabled(self.launching is None and (
            self.instance is not None or self._healed()))

    def _healed(self) -> bool:
        """Healing placed the model again as no instance this node owns (on this machine
        alone, or led by another): Stop unloads it, and this node stops the copy it
        placed elsewhere."""
        heal = self.healing() or {}
        return heal.get("state") == "serving" and self.instance is None

    def _show_privacy(self) -> None:
        """The note, where the placement's machines are joined by a shared link."""
        links = []
        if self.placement is not None:
            _model, _strategy, backend, ranks = self.placement
            links = shared_links([nid for nid, _ in ranks], self.state.edges(), backend)
        self.privacy_detail.setText(detail(links, self.state.node_name) if links else "")
        self.privacy.setVisible(bool(links))
        self.privacy_detail.setVisible(bool(links))

    def _set_headline(self, state: str, text: str, error: bool = False) -> None:
        self.state_text = state
        self.headline.setText(text)
        theme.set_role(self.headline, "error-strong" if error else "strong")

    # --- launching ------------------------------------------------------------------------
    def start(self, force: bool = False) -> None:
        if self.placement is None or self.launching is not None:
            return
        self.force_button.hide()
        model, strategy, backend, ranks = self.placement
        me = self.state.self_id
        nodes = [{"node": "self" if nid == me else nid,
                  **({"layers": list(layers)} if strategy == "pipeline" else {})}
                 for nid, layers in ranks]
        copies = self.copies_spin.value()
        self.launching = {"model": model, "ranks": [nid for nid, _ in ranks],
                          "copies": copies}
        self.failed_node = None
        self.log_button.hide()
        if copies > 1:  # which machines each copy gets is the node's answer
            self._make_rows([f"copy {i + 1}" for i in range(copies)],
                            [f"Copy {i + 1}" for i in range(copies)])
            for row in self.rows.values():
                row.show_state("Starting…", None, None)
            self._set_headline("Launching…", f"Launching {copies} copies of {model}, each "
                               "on machines of its own…")
        else:
            self._make_rows([nid for nid, _ in ranks])
            self._set_headline("Launching…",
                               f"Launching {model} {spread(strategy, len(ranks))}…")
        self.state.poller.interval = LAUNCH_POLL_S
        self.state.refresh()
        self._buttons()
        more: dict[str, Any] = {}  # one copy: today's request, unchanged
        if copies > 1:  # the node places each copy on machines of its own
            nodes, more = [], {"replicas": copies}
        elif self.prefill is not None:  # the planner's prefill node, for agents
            more = {"prefill": self.prefill[0], "prefill_min": self.prefill[1]}
        self.tasks.run(self.client.launch, model, strategy, nodes, backend, force=force,
                       kv_bits=self.kv_bits, **more,
                       on_done=self._launched, on_error=self._launch_failed, owner=self)

    def _make_rows(self, ids: list[str], names: list[str] | None = None) -> None:
        for row in self.rows.values():
            self.grid.removeWidget(row)
            row.deleteLater()
        self.rows = {}
        for i, nid in enumerate(ids):
            row = self.rows[nid] = NodeProgress(names[i] if names else
                                                self.state.node_name(nid))
            self.grid.addWidget(row, i, 0)

    def _launched(self, result: InstanceInfo | LaunchedReplicas) -> None:
        self.launching = None
        self.state.poller.interval = TOPOLOGY_EVERY_S
        if isinstance(result, LaunchedReplicas):
            self._copies_up(result)
        else:
            self.copies = []
            self.instance = result.to_json()  # as the topology's instances read
            for row in self.rows.values():
                row.show_state("Loaded", 1, 1)
            self._set_headline("Ready", f"Ready: {result.model} runs "
                               f"{spread(result.strategy, len(result.ranks))}. "
                               "Chat with it in the Chat tab.")
        self.state.set_planned({})  # what was planned is now in use
        self.state.refresh()
        self.replicas.refresh()
        self._buttons()
        self.launched.emit(result)

    def _copies_up(self, result: LaunchedReplicas) -> None:
        """Each copy's machines, in a row of its own (keyed by the machine answering for
        it, which the topology reports as here or gone)."""
        copies = result.instances
        self.copies = [c.to_json() for c in copies]
        me = self.state.self_id
        here = [c for c in self.copies if (c.get("ranks") or [{}])[0].get("node") == me]
        self.instance = (here or self.copies or [None])[0]
        names = [self._machines(c) for c in copies]
        self._make_rows([c.ranks[0].node if c.ranks else f"copy {i + 1}"
                         for i, c in enumerate(copies)], names)
        for row in self.rows.values():
            row.show_state("Loaded", 1, 1)
        where = "; ".join(f"one on {n}{_how(c.strategy, len(c.ranks))}"
                          for n, c in zip(names, copies, strict=True))
        model = result.model or (self.placement[0] if self.placement else "the model")
        self._set_headline("Ready", f"Ready: {len(copies)} copies of {model} run: {where}. "
                           "Chat with it in the Chat tab; requests are shared between them.")

    def _machines(self, copy: InstanceInfo) -> str:
        names = [self.state.node_name(r.node) for r in copy.ranks]
        return joined(names) if names else "a machine"

    def _launch_failed(self, error: BaseException) -> None:
        copies = (self.launching or {}).get("copies") or 1
        self.launching = None
        self.state.poller.interval = TOPOLOGY_EVERY_S
        reason = message_of(error)
        self.failed_node = getattr(error, "node", None)  # the node the error is on
        for nid, row in self.rows.items():
            if self.failed_node in (nid, self.state.node_name(nid)):
                row.show_state("Failed", 0, 1, failed=True)
            elif row.text.text() != "Loaded":
                row.show_state("Stopped", 0, 1)
        who = f" on {self.state.node_name(self.failed_node)}" if self.failed_node else ""
        risk = ""
        # too little memory for one copy can be forced; for more copies, fewer is the way
        if getattr(error, "code", None) == "insufficient_memory" and copies == 1:
            risk = f" {RISK}"
            self.force_button.show()
        what = f"Launching {copies} copies failed" if copies > 1 else "Launch failed"
        self._set_headline("Failed", f"{what}{who}: {reason}{risk}", error=True)
        self.log_button.setVisible(self.logs_dir is not None)
        self.state.refresh()
        self._buttons()

    # --- following progress and the running instance ----------------------------------------
    def healing(self) -> dict[str, Any] | None:
        """The owner's record of a lost node and what it did (HealInfo), if any."""
        return (self.state.status.get("cluster") or {}).get("healing") or None

    def _show_healing(self) -> None:
        heal = self.healing()
        self.heal_label.setVisible(heal is not None)
        if heal is not None:
            self.heal_label.setText(heal.get("message") or "")
            self.heal_label.setToolTip(heal.get("detail") or "")  # the nodes' own words
            theme.set_role(self.heal_label, "error-strong" if heal.get("state") in (
                "doesnt_fit", "failed", "off") else "muted")
        self.restore_button.setVisible(bool(heal and heal.get("back") and heal.get("original"))
                                       and self.launching is None)

    def restore(self) -> None:
        """Launch the placement that ran before the node was lost."""
        heal = self.healing()
        original = (heal or {}).get("original")
        if not original or self.launching is not None:
            return
        ranks = [(n["node"], tuple(n.get("layers") or (0, 0))) for n in original["nodes"]]
        self.set_placement(original["model"], original.get("strategy", "pipeline"),
                           original.get("backend", "ring"), ranks,  # type: ignore[arg-type]
                           original.get("kv_bits"))
        self.restore_button.hide()
        self.start()

    def _follow(self) -> None:
        self._show_privacy()  # a link measured, or typed by a cable, since
        self._show_healing()
        own = self.state.own_instance()
        heal = self.healing()
        if self.launching is None and heal and heal.get("state") in ("placing", "serving") \
                and (own is None or own.get("state") != "ready"):
            self._show_heal_rows(heal)
            return
        if self.launching is None:
            if own is not None and own.get("state") == "ready":
                if self.instance is None or self.instance.get("id") != own.get("id"):
                    self.instance = own  # running before the app started, or after a relaunch
                    ranks = [r["node"] for r in own.get("ranks") or []]
                    self._make_rows(ranks)
                    self._set_headline("Ready", f"Running: {own['model']} "
                                       f"{spread(own.get('strategy'), len(ranks))}.")
                for row in self.rows.values():
                    row.show_state("Loaded", 1, 1)
                self._mark_gone()
            elif self.instance is not None:
                ended = self._ended(self.instance.get("id"))
                if ended is not None:
                    self.instance = None
                    for row in self.rows.values():
                        row.show_state("Stopped", 0, 1)
                    self._mark_gone()
                    if self.state_text == "Ready":
                        state, reason = ended
                        failed = state == "failed"
                        self._set_headline("Stopped", f"Stopped: {reason}" if failed else
                                           "Stopped", error=failed)
            self._buttons()
            return
        runner = self.state.status.get("runner") or {}
        me = self.state.self_id
        for nid, row in self.rows.items():
            if nid == me:
                if runner.get("type") == "Loading":
                    done, total = runner.get("layers_done"), runner.get("layers_total")
                    row.show_state(f"Loading layers {done}/{total}" if total else
                                   "Starting the worker…", done if total else None, total)
                elif runner.get("type") == "Ready":
                    row.show_state("Loaded", 1, 1)
                continue
            st, progress = self._follower_state(nid)
            if st == "ready":
                row.show_state("Loaded", 1, 1)
            elif st == "starting":
                done, total = progress or (0, 0)
                row.show_state(f"Loading layers {done}/{total}" if total else
                               "Loading its layers…", done if total else None,
                               total or None)

    def _show_heal_rows(self, heal: dict[str, Any]) -> None:
        """The model placed again after a machine was lost: a row for each machine it is
        placed on, and one for each lost machine, which no longer shows Loaded."""
        on, lost = list(heal.get("on") or []), list(heal.get("lost") or [])
        names = joined(heal.get("on_names") or [self.state.node_name(n) for n in on]
                       or ["the machines that remain"])
        gone = joined(heal.get("lost_names") or ["a machine"])
        ids = on + [n for n in lost if n not in on]
        if list(self.rows) != ids:
            self.instance = None
            self._make_rows(ids)
        placing = heal.get("state") == "placing"
        for nid in on:
            if placing:
                self.rows[nid].show_state("Placing again…", None, None)
            else:
                self.rows[nid].show_state("Loaded", 1, 1)
        for nid in lost:
            if heal.get("back") and nid not in on:
                self.rows[nid].show_state("Back, not in use", 0, 1)
        self._mark_gone()
        if placing:
            about = f", about {heal['estimate_s']:.0f} s" if heal.get("estimate_s") else ""
            self._set_headline("Placing again", f"Placing {heal.get('model')} again on "
                               f"{names}{about}.")
        else:
            self._set_headline("Ready", f"Running again without {gone}: "
                               f"{heal.get('model')} on {names}.")
        self._buttons()

    def _mark_gone(self) -> None:
        """Rows of machines that left or stopped answering say so, not Loaded."""
        heal = self.healing() or {}
        left = bool(heal.get("left")) and not heal.get("back")
        lost = set() if heal.get("back") else set(heal.get("lost") or [])
        here = {n.get("id") for n in self.state.topology.get("nodes") or []
                if n.get("self") or n.get("reachable")}
        for nid, row in self.rows.items():
            if nid in lost:
                row.show_state("Left" if left else "Not answering", 0, 1, failed=True)
            elif here and nid not in here:
                row.show_state("Not answering", 0, 1, failed=True)

    def _follower_state(self, node_id: str) -> tuple[str | None, list[int] | None]:
        """The node's rank state and [layers loaded, total], as it reports them."""
        for n in self.state.topology.get("nodes") or []:
            if n.get("id") == node_id:
                followers = n.get("followers") or []
                if followers:
                    return followers[-1].get("state"), followers[-1].get("progress")
        return None, None

    def _ended(self, instance_id: str | None) -> tuple[str, str | None] | None:
        """(state, reason) once this node reports the instance stopped or failed."""
        for inst in (self.state.status.get("cluster") or {}).get("instances") or []:
            if inst.get("id") == instance_id and inst.get("state") in ("stopped", "failed"):
                return inst["state"], inst.get("reason")
        return None

    # --- stopping and logs ----------------------------------------------------------------
    def stop(self) -> None:
        """Stop what this panel runs: every copy launched together, or the one model."""
        targets = self.copies if len(self.copies) > 1 else \
            [self.instance] if self.instance is not None else []
        if targets:
            model = targets[0].get("model")
            ids, unload, elsewhere = self._stops(targets)
            call: tuple[Any, ...] = (_stop_all, self.client, ids, unload)
            after = "Stopped"
            if elsewhere:  # alone on another machine: no id this node could stop it by
                after = (f"Stopped, but not the copies on {joined(elsewhere)}: stop them in "
                         "Shoal on those machines." if len(targets) > 1 else
                         f"It runs alone on {elsewhere[0]}: stop it in Shoal on that "
                         "machine.")
        elif self._healed():  # no instance of ours: the node unloads what healing placed
            model, call, after = self.healing()["model"], (self.client.unload,), "Stopped"
        else:
            return
        self.stop_button.setEnabled(False)
        self._set_headline("Stopping…", f"Stopping {model}…")
        self.tasks.run(*call, on_done=lambda _r: self._stopped(after=after),
                       on_error=lambda e: self._set_headline(
                           "Ready", f"Couldn't stop it: {message_of(e)}", error=True), owner=self)

    def _stops(self, targets: list[dict[str, Any]]) -> tuple[list[str], bool, list[str]]:
        """How to stop them: the groups' ids, whether one runs alone here (unloaded), and
        the machines of those alone elsewhere, which only they can stop."""
        me = self.state.self_id
        ids, unload, elsewhere = [], False, []
        for inst in targets:
            first = ((inst.get("ranks") or [{}])[0]).get("node")
            if inst.get("id"):
                ids.append(inst["id"])
            elif first in (me, None):
                unload = True
            else:
                elsewhere.append(self.state.node_name(first))
        return ids, unload, elsewhere

    def _stopped(self, _result: Any = None, after: str = "Stopped") -> None:
        self.instance, self.copies = None, []
        for row in self.rows.values():
            row.show_state("Stopped", 0, 1)
        self._set_headline("Stopped", after, error=after != "Stopped")
        self.state.refresh()
        self.replicas.refresh()
        self._buttons()

    def log_path(self) -> Path | None:
        """The local log that tells most about the failure: this node's worker when it
        failed here, else this node's own log (it records what the others answered)."""
        if self.logs_dir is None:
            return None
        if self.failed_node in (self.state.self_id, None):
            worker = self.logs_dir / "worker.log"
            if worker.exists():
                return worker
        return self.logs_dir / "node.log"

    def show_log(self) -> None:
        path = self.log_path()
        if path is None:
            return
        self.log_dialog = LogDialog(path, self)
        self.log_dialog.show()
