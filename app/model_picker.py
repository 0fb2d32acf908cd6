"""The chat's model picker, like LM Studio's: each model with its size, whether it fits
these machines, and whether it is loaded (or loading, and how far), from what the node
reports (its model list, its status) and the cluster's machines."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtWidgets import QComboBox, QStyledItemDelegate, QStyleOptionViewItem, QWidget

from app.catalog import fit_badge, spread
from app.common import fmt_bytes
from app.snapshots import NodeCard
from app.status import progress_of
from engine.records import CatalogModel, ModelCard

DETAIL = Qt.ItemDataRole.UserRole + 1  # an item's "270 MB · fits this machine · loaded"


def _percent(done: int, total: int) -> str:
    return f"{100 * done // max(total, 1)}%"


def instance_state(inst: dict[str, Any]) -> str | None:
    """'running on 3 machines, split by layers', 'starting on 2 machines (40%)'."""
    ranks = inst.get("ranks") or []
    if len(ranks) < 2 or inst.get("state") not in ("starting", "ready"):
        return None
    where = spread(inst.get("strategy"), len(ranks))
    if inst.get("state") == "ready":
        return f"running {where}"
    progress = [r.get("progress") for r in ranks if r.get("progress")]
    done, total = sum(p[0] for p in progress), sum(p[1] for p in progress)
    return f"starting {where}" + (f" ({_percent(done, total)})" if total else "")


def loaded_state(model: str, status: dict[str, Any],
                 instance: dict[str, Any] | None = None) -> str | None:
    """What the node says of `model`: loaded, loading 40%, running on N machines; None
    when it isn't loaded anywhere."""
    runner = status.get("runner") or {}
    if runner.get("model") == model:
        progress = progress_of(runner)
        if runner.get("type") == "Ready":  # (on llama.cpp: a Linux CPU node's GGUF model)
            return "loaded on llama.cpp" if runner.get("engine") == "llamacpp" else "loaded"
        if runner.get("type") == "Loading":
            return "loading" + (f" {_percent(*progress)}" if progress else "")
        if runner.get("type") == "Preparing":
            return "preparing" + (f" {_percent(*progress)}" if progress else "")
    own = [i for i in (status.get("cluster") or {}).get("instances") or []
           if i.get("model") == model]
    for inst in [*own, *([instance] if instance else [])]:
        said = instance_state(inst)
        if said:
            return said
    return None


def model_detail(card: ModelCard, status: dict[str, Any], cards: list[NodeCard]
                 ) -> tuple[str, str]:
    """The line beside a model in the picker, and its tooltip."""
    facts = card.shoal
    parts, tip = [], ""
    if facts.size_bytes:
        parts.append(fmt_bytes(facts.size_bytes))
    if cards:
        badge = fit_badge(CatalogModel(id=card.id, size_bytes=facts.size_bytes), cards)
        if facts.size_bytes:
            parts.append(badge.text)
            tip = badge.tip
    instance = facts.instance.to_json() if facts.instance is not None else None
    state = loaded_state(card.id, status, instance)
    if state:
        parts.append(state)
    return " · ".join(parts), tip


class _DetailDelegate(QStyledItemDelegate):
    """Shows an item as 'id — detail' while its text stays the bare id (what is sent)."""

    def initStyleOption(self, option: QStyleOptionViewItem,  # noqa: N802 - Qt's name
                        index: QModelIndex | QPersistentModelIndex) -> None:
        super().initStyleOption(option, index)
        detail = index.data(DETAIL)
        if detail:
            option.text = f"{option.text}  —  {detail}"  # type: ignore[attr-defined]


class ModelPicker(QComboBox):
    """An editable list of the node's models (an id or path not listed may be typed)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setEditable(True)
        self._delegate = _DetailDelegate(self)  # kept: Qt calls its Python override
        self.setItemDelegate(self._delegate)
        self.models: list[ModelCard] = []
        self.status: dict[str, Any] = {}
        self.cards: list[NodeCard] = []

    def set_models(self, models: list[ModelCard]) -> None:
        text = self.currentText()
        self.models = list(models)
        self.blockSignals(True)
        self.clear()
        self.addItems([m.id for m in models])
        self.setCurrentText(text)
        self.blockSignals(False)
        self._describe()

    def set_status(self, status: dict[str, Any]) -> None:
        self.status = status
        self._describe()

    def set_cards(self, cards: list[NodeCard]) -> None:
        self.cards = list(cards)
        self._describe()

    def detail(self, model: str) -> str:
        """The detail shown beside `model` ('' when it isn't listed)."""
        i = self.findText(model, Qt.MatchFlag.MatchExactly)
        return str(self.itemData(i, DETAIL) or "") if i >= 0 else ""

    def shown_text(self, i: int) -> str:
        """Item i as the list shows it."""
        option = QStyleOptionViewItem()
        self.itemDelegate().initStyleOption(option, self.model().index(i, 0))
        return str(option.text)  # type: ignore[attr-defined]

    def _describe(self) -> None:
        for i, card in enumerate(self.models):
            detail, tip = model_detail(card, self.status, self.cards)
            self.setItemData(i, detail, DETAIL)
            self.setItemData(i, tip or None, Qt.ItemDataRole.ToolTipRole)
        current = self.detail(self.currentText())
        self.setToolTip("The model to chat with (Ctrl+L)" + (f": {current}" if current
                                                             else ""))
