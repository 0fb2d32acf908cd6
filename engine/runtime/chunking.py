"""Prefill chunk sizes for batched serving: as many prompt tokens as take about `target_s`.

A chunk can't be interrupted once MLX evaluates it, so a request that arrives while a long
prompt prefills waits for the chunk in progress. Sizing chunks by time, not tokens, bounds
that wait on any machine: on this CPU a 0.1 s chunk of SmolLM2 is ~16 tokens; on an
Apple GPU the same rule gives chunks of hundreds. Measured on SmolLM2 (2-core CPU),
prefill throughput is within 30% from 16- to 256-token chunks, so small chunks cost little.
Attention over a growing prompt makes later chunks slower; each chunk's size follows the
last one's measured rate. A prompt that prefills alone (nothing decodes, nothing waits)
takes chunks of about a second instead: on an Apple GPU a 0.1 s chunk of a large mixture
of experts is a few dozen tokens that read most of its experts, a fraction of the rate
of large chunks (the planner's time-to-first-token model counts this, engine/placement/
cost.py).

While answers decode, a waiting prompt's chunk is worth at least DECODE_SHARE decode steps
(as last measured): chunking doesn't spare the decoding answers any time (the prompt's
work is the same in one chunk or ten), it only spreads it, and each chunk costs the
waiting request one more decode step before its first token. Where a step takes longer
than TARGET_S / DECODE_SHARE (a CPU, a large batch), a short prompt then goes in at once,
as mlx_lm.server's 2048-token steps take it, instead of behind a dozen decode steps.
The one-process batcher's chunks are never below BESIDE tokens for the same reason: a
chat turn's prompt goes in at once (a few hundred milliseconds on this CPU, tens on a
GPU), while a long one is still cut.
"""

from __future__ import annotations

TARGET_S = 0.1   # one chunk's time: a short request waits about this long for a turn
ALONE_S = 1.0    # ... while a prompt prefills alone: few, large chunks, and a request
                 # that arrives waits at most about this long before chunks shrink
SMALLEST = 16
LARGEST = 2048    # mlx-lm's prefill_step_size
FIRST = 64
DECODE_SHARE = 4  # a chunk's time is at least this many decode steps'
BESIDE = 256  # the one-process batcher's least chunk (engine/runtime/batching.py)


class Chunker:
    def __init__(self, target_s: float = TARGET_S, first: int = FIRST,
                 alone_s: float = ALONE_S, least: int = SMALLEST):
        self.target_s, self.alone_s, self.least = target_s, alone_s, least
        self._first = first
        self._rate = 0.0  # prompt tokens per second, as last measured
        self.step_s = 0.0  # one decode step's seconds, as last measured

    def size(self, alone: bool = False) -> int:
        """The next chunk: `alone` when nothing else decodes or waits, so no one waits
        on a larger chunk (a small chunk reads every weight for few tokens: a mixture of
        experts reads most of its experts for 16 tokens as for 2048)."""
        if not self._rate:
            return self._first
        target = self.alone_s if alone else max(self.target_s, DECODE_SHARE * self.step_s)
        want = int(self._rate * target)
        return max(self.least, min(LARGEST, want // SMALLEST * SMALLEST))

    def one_step(self) -> int:
        """About as many prompt tokens as one decode step takes (SMALLEST until both
        are measured): prompt work that costs the batch little."""
        return max(SMALLEST, int(self._rate * self.step_s))

    def took(self, tokens: int, seconds: float) -> None:
        """A prefill of `tokens` took `seconds`: size the next chunk from that rate."""
        if tokens <= 0 or seconds <= 0:
            return
        self._rate = tokens / seconds

    def decoded(self, seconds: float) -> None:
        """A decode step took `seconds` (one after another: the step after a chunk
        measures little, its work having been evaluated with the chunk)."""
        if seconds > 0:
            self.step_s = seconds
