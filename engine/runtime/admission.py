"""Admission: a request starts only where its KV fits in the memory the worker has left,
so a long prompt never takes the machine down (on a Mac, unified memory near full can
panic the kernel).

A request needs its prompt's KV (what the prefix cache didn't hold) plus room for the
first tokens of its answer (`RESERVE`, or its max_tokens if fewer). What is left is, on a
Mac, what Metal may wire (its working set, or the wired limit the user set) less what
MLX holds now; elsewhere what the OS reports available now; or the limit the user gave
(`--memory-limit`), less what MLX holds. Where it doesn't fit, the prefix cache gives up
entries first; then the request waits for those in flight to finish, or, with none in
flight, is refused with a 503 that gives both figures. Answers that grow past their
reserve are watched too: where what is left can't hold the next steps, the longest
answer ends there ("length").

A group's rank 0 can't see the other ranks' memory while it serves, so each rank says,
as the group forms, how many tokens of KV its share of the model has room for beyond
its prefix cache's budget (`tokens_of_room`); rank 0 then admits by tokens against the
least of those (`GroupAdmission`), counting what the requests in flight took.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from engine.errors import Busy

log = logging.getLogger(__name__)

RESERVE = 1024  # answer tokens a request must have room for before it starts
MARGIN = 0.05  # of the budget, kept free for activations and the allocator's slack
GUARD_STEPS = 16  # decode steps between the one-process batcher's looks at its room


class NoRoom(Busy):
    """A request's KV can't fit even with nothing else in flight (503)."""
    code = "insufficient_memory"


def kv_bytes_per_token(config: dict[str, Any], kv_bits: int | None) -> float:
    """Bytes one token's KV takes over every layer (the planner's rule); 0 where the
    planner can't read the config (then every request is admitted, as before)."""
    from engine.placement.model import ModelSpec, kv_value_bytes

    try:
        spec = ModelSpec.from_config(config)
    except Exception as e:  # a family the planner doesn't know the shape of
        log.warning("admission off: can't size this model's KV (%s)", e)
        return 0.0
    # kv_per_token is per layer; every layer is counted in full, sliding windows too
    # (a prompt shorter than its window fills it): more than some prompts take, never less
    return float(spec.kv_per_token * kv_value_bytes(kv_bits) * spec.layers)


def room_now(limit: int | None = None) -> int:
    """Bytes this worker may still allocate (see the module's docstring)."""
    import mlx.core as mx

    from engine.telemetry.memory import memory_info

    held = int(mx.get_active_memory())
    if limit:
        return int(limit * (1 - MARGIN)) - held
    info = memory_info()
    if info.available_bytes is None:
        return 1 << 62  # nothing to go by: admit (the log of memory_info says why)
    if sys.platform == "darwin":  # Metal's budget covers what this process holds too
        return int(info.available_bytes * (1 - MARGIN)) - held
    total = info.total_bytes or info.available_bytes
    return int(info.available_bytes - MARGIN * total)


class Admission:
    """Decides whether a request may start now (see the module's docstring)."""

    def __init__(self, per_token: float, limit: int | None = None,
                 room: Callable[[int | None], int] = room_now):
        self.per_token, self.limit, self._room = per_token, limit, room

    def need(self, prompt: int, cached: int, max_tokens: int) -> int:
        return int(self.per_token * (prompt - cached + min(max_tokens, RESERVE)))

    def check(self, need: int, in_flight: int, evict: Callable[[], bool]) -> bool:
        """True: start it; False: wait for those in flight. NoRoom where it can't ever
        fit. `evict` drops one prefix-cache entry (False when none is left)."""
        room = self._room(self.limit)
        while need > room and evict():
            room = self._room(self.limit)
        if need <= room:
            return True
        if in_flight:
            return False
        raise NoRoom(f"This request's KV cache needs {_size(need)} and the worker has "
                     f"{_size(max(room, 0))} left with nothing else running: send a "
                     f"shorter prompt or a smaller max_tokens, or serve the model on more "
                     f"memory (or with kv_bits 8).")


    def running_short(self, rows: int, evict: Callable[[], bool]) -> bool:
        """Whether what is left can't hold the next GUARD_STEPS tokens of `rows` answers
        twice over, once prefix-cache entries are given up (then the longest ends)."""
        need = self.per_token * rows * GUARD_STEPS * 2
        while self._room(self.limit) < need:
            if not evict():
                return True
        return False


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


INT32 = (1 << 31) - 1


def tokens_of_room(per_token: float, share: float, prefix_left: int,
                   limit: int | None) -> int:
    """Tokens of KV a rank holding `share` of every token's KV can still take, less the
    `prefix_left` tokens its prefix cache may still grow by."""
    per = per_token * share
    if per <= 0:
        return INT32  # nothing to size the KV by: admit, as one process does
    return max(0, min(INT32, int(room_now(limit) / per) - prefix_left))


class GroupAdmission:
    """Rank 0's admission for a group, by tokens (see the module's docstring). `rooms`:
    each rank's tokens of room; `where` names a rank ("rank 1 (10.0.0.2:5001)")."""

    def __init__(self, rooms: list[int], where: Callable[[int], str]):
        self.tokens = min(rooms)
        self.short = where(rooms.index(self.tokens))
        log.info("admission: the group has room for %d tokens of KV (the least, on %s)",
                 self.tokens, self.short)

    @staticmethod
    def need(prompt: int, cached: int, max_tokens: int) -> int:
        return prompt - cached + min(max_tokens, RESERVE)

    def check(self, need: int, taken: int, in_flight: int) -> bool:
        """True: start it; False: wait for the `in_flight` requests, which took `taken`
        tokens. NoRoom where it can't fit with nothing else running."""
        if taken + need <= self.tokens:
            return True
        if in_flight:
            return False
        raise NoRoom(f"This request's KV cache needs {need} tokens' room and the group has "
                     f"{self.tokens} (the least, on {self.short}) with nothing else "
                     f"running: send a shorter prompt or a smaller max_tokens, or serve "
                     f"the model on more memory (or with kv_bits 8).")
