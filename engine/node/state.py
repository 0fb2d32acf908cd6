"""Runner states and the node's status snapshot: frozen values the GUI can match on."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from engine.protocol import NodeState, StatusInfo


@dataclass(frozen=True)
class Idle:
    """No model loaded."""


@dataclass(frozen=True)
class Preparing:
    """Before a model can load: e.g. the bundled default model being imported on first
    run. `done`/`total` are 0 when the step can't say how far it is."""
    model: str
    step: str
    done: int = 0
    total: int = 0


@dataclass(frozen=True)
class Loading:
    model: str
    layers_done: int = 0
    layers_total: int = 0


@dataclass(frozen=True)
class Ready:
    model: str
    context_length: int
    pid: int
    generating: bool = False


@dataclass(frozen=True)
class Failed:
    model: str | None
    reason: str


RunnerState = Idle | Preparing | Loading | Ready | Failed


def state_name(s: RunnerState) -> NodeState:
    if isinstance(s, (Loading, Preparing)):
        return NodeState.LOADING
    if isinstance(s, Ready):
        return NodeState.GENERATING if s.generating else NodeState.IDLE
    if isinstance(s, Failed):
        return NodeState.ERROR
    return NodeState.IDLE


def status_record(s: RunnerState, version: str, **extra: Any) -> StatusInfo:
    """The /shoal/status body: a flat "state" for simple clients plus the typed runner."""
    return StatusInfo(state=state_name(s), model=getattr(s, "model", None),
                      error=s.reason if isinstance(s, Failed) else None,
                      runner={"type": type(s).__name__, **asdict(s)}, version=version,
                      **extra)

