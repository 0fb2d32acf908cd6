"""The cluster as the views see it: the latest /shoal/topology and /shoal/status snapshots,
plus two overlays on the memory bars (what Shoal's running model uses, what the selected
placement would add, once the user has seen that placement). Views listen to `changed`,
emitted at most every ~80 ms.

What Shoal uses on each node is the planner's prediction for the running placement: the
node reports its machine's memory, not its worker's, and the prediction is what the
placement view shows too.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QEvent, QObject, QTimer, Signal
from PySide6.QtWidgets import QWidget

from app.polling import Poller
from app.sentences import remember
from app.snapshots import LinkEdge, NodeCard, link_edges, node_cards, running_instances
from app.tasks import Tasks
from engine.client import NodeClient
from engine.cluster_records import PlanInfo

log = logging.getLogger(__name__)
TOPOLOGY_EVERY_S = 2.0


def remember_machines(topology: dict[str, Any]) -> None:
    """Every view's errors name machines, not ids or addresses: teach the names."""
    names: dict[str, str] = {}
    for n in topology.get("nodes") or []:
        name = n.get("name")
        if not name:
            continue
        if n.get("id"):
            names[n["id"]] = name
        host = (n.get("url") or "").split("://")[-1].rstrip("/")
        if host:
            names[host] = name
    remember(names)


class ClusterState(QObject):
    changed = Signal()

    def __init__(self, tasks: Tasks, client: NodeClient, interval: float = TOPOLOGY_EVERY_S,
                 api_key: str | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.tasks, self.client = tasks, client
        self.status: dict[str, Any] = {}
        self.topology: dict[str, Any] = {"nodes": [], "links": []}
        self.error: str | None = None  # why the topology is unknown (node gone, old node)
        self.planned: dict[str, int] = {}
        self._plan_view: QWidget | None = None  # where plans are made (the Placement tab)
        self._plan_seen = True
        self.shoal_use: dict[str, int] = {}
        self._use_key: str | None = None  # which running model shoal_use describes
        self.poller = Poller(tasks, client.base_url, lambda c: c.topology().to_json(), interval,
                             api_key=api_key, parent=self)
        self.poller.updated.connect(self.set_topology)
        self.poller.failed.connect(self._topology_failed)
        self._emit = QTimer(self, singleShot=True, interval=80)
        self._emit.timeout.connect(self.changed)

    def start(self) -> None:
        self.poller.start()

    def stop(self) -> None:
        self.poller.stop()

    def refresh(self) -> None:
        """Poll the topology now (after adding a peer, launching, stopping)."""
        self.poller.poke()

    def _touch(self) -> None:
        if not self._emit.isActive():
            self._emit.start()

    # --- inputs ---------------------------------------------------------------------------
    def set_topology(self, topology: dict[str, Any]) -> None:
        self.topology, self.error = topology, None
        remember_machines(topology)
        self._follow_running_model()
        self._touch()

    def _topology_failed(self, error: BaseException) -> None:
        self.error = getattr(error, "message", str(error))
        self._touch()

    def set_status(self, status: dict[str, Any]) -> None:
        self.status = status
        self._follow_running_model()
        self._touch()

    def set_planned(self, per_node: dict[str, int]) -> None:
        if per_node != self.planned:
            if not self.planned:  # a new plan: seen if made where the user looks
                self._plan_seen = self._plan_view is None or self._plan_view.isVisible()
            self.planned = dict(per_node)
            self._touch()

    def watch_plan_view(self, view: QWidget) -> None:
        """Planned memory shows only for a plan the user has seen: one made while `view`
        (where plans are made) was on screen, or shown since; not the plan the app makes
        by itself at start-up."""
        self._plan_view = view
        self._plan_seen = view.isVisible()
        view.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's
        if watched is self._plan_view and event.type() == QEvent.Type.Show \
                and not self._plan_seen:
            self._plan_seen = True
            self._touch()
        return False

    # --- derived values -------------------------------------------------------------------
    @property
    def shown_plan(self) -> dict[str, int]:
        """What the memory bars show as planned: the plan on screen, else nothing."""
        return self.planned if self._plan_seen else {}

    def cards(self) -> list[NodeCard]:
        return node_cards(self.topology, self.shoal_use, self.shown_plan)

    def edges(self) -> list[LinkEdge]:
        return link_edges(self.topology)

    @property
    def self_id(self) -> str | None:
        for n in self.topology.get("nodes") or []:
            if n.get("self"):
                return n.get("id")
        return (self.status.get("cluster") or {}).get("id")

    def instances(self) -> list[dict[str, Any]]:
        return running_instances(self.topology)

    def own_instance(self) -> dict[str, Any] | None:
        """The instance the local node owns (it holds rank 0), if any is starting or ready."""
        for inst in (self.status.get("cluster") or {}).get("instances") or []:
            if inst.get("state") in ("starting", "ready"):
                return inst
        return None

    def node_name(self, node_id: str) -> str:
        for c in self.cards():
            if c.id == node_id:
                return c.name
        return node_id

    # --- what the running model uses --------------------------------------------------------
    def _follow_running_model(self) -> None:
        """Ask the planner once per running model what it uses on each node."""
        key, request = None, None
        ready = [i for i in self.instances() if i.get("state") == "ready"]
        runner = self.status.get("runner") or {}
        if ready:
            inst = ready[0]
            key = f"instance:{inst['id']}"
            nodes = [{"node": r["node"], **({"layers": r["layers"]}
                                            if inst.get("strategy") == "pipeline" else {})}
                     for r in inst.get("ranks") or []]
            request = (inst.get("model"), None, inst.get("strategy"), nodes)
        elif runner.get("type") == "Ready" and self.self_id and not self._is_follower():
            key = f"local:{runner.get('model')}"
            request = (runner.get("model"), runner.get("context_length"), "pipeline",
                       [{"node": self.self_id}])
        if key == self._use_key:
            return
        self._use_key = key
        if request is None:
            self.shoal_use = {}
            self._touch()
            return
        model, context, strategy, nodes = request

        def done(report: PlanInfo, asked: str | None = key) -> None:
            if asked != self._use_key:
                return  # the model changed meanwhile
            ranks = report.placements[0].ranks if report.placements else []
            self.shoal_use = {r.node: r.memory.total for r in ranks}
            self._touch()

        self.tasks.run(self.client.plan, model, context, strategy, nodes, on_done=done,
                       on_error=lambda e: log.info("No memory prediction for %s: %s",
                                                   model, e), owner=self)

    def _is_follower(self) -> bool:
        return any(f.get("state") in ("starting", "ready")
                   for f in (self.status.get("cluster") or {}).get("followers") or [])
