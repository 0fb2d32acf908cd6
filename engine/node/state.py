"""Runner states and the node's status snapshot: frozen values the GUI can match on."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from engine.protocol import NodeState, StatusInfo


@dataclass(frozen=True)
class Idle:
    """No model loaded; `unloaded` names the one unloaded after `idle_s` seconds unused
    (the next request for it loads it again)."""
    unloaded: str | None = None
    idle_s: float = 0.0


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


DURATION = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(v: Any) -> float | None:
    """How long a model stays loaded unused, as Ollama's keep_alive says it: seconds, or a
    Go duration ("5m", "1h30m"); negative (or "never") keeps it loaded (None), 0 unloads
    it once its requests are done. A ValueError says what is wrong."""
    text = v.strip() if isinstance(v, str) else None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        seconds = float(v)
    elif text == "never":
        return None
    elif text is not None and re.fullmatch(r"-?\d+(\.\d*)?", text):
        seconds = float(text)
    elif text is not None and re.fullmatch(r"-?(" + DURATION.pattern + ")+", text):
        sign = -1.0 if text.startswith("-") else 1.0
        seconds = sign * sum(float(n) * UNITS[u] for n, u in DURATION.findall(text))
    else:
        raise ValueError(f"expected seconds or a duration like \"5m\" or \"1h\" "
                         f"(negative: keep the model loaded), not {v!r}")
    return None if seconds < 0 else seconds
