"""Prefill chunk sizes for batched serving: as many prompt tokens as take about `target_s`.

A chunk can't be interrupted once MLX evaluates it, so a request that arrives while a long
prompt prefills waits for the chunk in progress. Sizing chunks by time, not tokens, bounds
that wait on any machine: on this CPU a 0.1 s chunk of SmolLM2 is ~16 tokens; on an
Apple GPU the same rule gives chunks of hundreds. Measured on SmolLM2 (2-core CPU),
prefill throughput is within 30% from 16- to 256-token chunks, so small chunks cost little.
Attention over a growing prompt makes later chunks slower; each chunk's size follows the
last one's measured rate.
"""

from __future__ import annotations

TARGET_S = 0.1   # one chunk's time: a short request waits about this long for a turn
SMALLEST = 16
LARGEST = 2048    # mlx-lm's prefill_step_size
FIRST = 64


class Chunker:
    def __init__(self, target_s: float = TARGET_S, first: int = FIRST):
        self.target_s = target_s
        self._next = first

    def size(self) -> int:
        return self._next

    def took(self, tokens: int, seconds: float) -> None:
        """A prefill of `tokens` took `seconds`: size the next chunk from that rate."""
        if tokens <= 0 or seconds <= 0:
            return
        want = int(tokens / seconds * self.target_s) // SMALLEST * SMALLEST
        self._next = max(SMALLEST, min(LARGEST, want))
