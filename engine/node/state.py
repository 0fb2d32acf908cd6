"""The node's status snapshot from its runner state (engine.records' Runner* records)."""

from __future__ import annotations

from typing import Any

from engine.records import (
    NodeState,
    RunnerFailed,
    RunnerLoading,
    RunnerPreparing,
    RunnerReady,
    RunnerState,
    StatusInfo,
)


def state_name(s: RunnerState) -> NodeState:
    if isinstance(s, (RunnerLoading, RunnerPreparing)):
        return NodeState.LOADING
    if isinstance(s, RunnerReady):
        return NodeState.GENERATING if s.generating else NodeState.IDLE
    if isinstance(s, RunnerFailed):
        return NodeState.ERROR
    return NodeState.IDLE


def status_record(s: RunnerState, version: str, **extra: Any) -> StatusInfo:
    """The /shoal/status body: a flat "state" for simple clients plus the typed runner."""
    return StatusInfo(state=state_name(s), model=getattr(s, "model", None),
                      error=s.reason if isinstance(s, RunnerFailed) else None,
                      runner=s, version=version, **extra)
