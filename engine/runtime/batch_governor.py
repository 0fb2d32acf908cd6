"""The draft governor of batched decoding: one for every batch size, so what one size
learns (how often guesses are kept, what a guess costs) serves the others.

A pass over a batch of `size` sequences, `m` guesses wide, costs about plain(size) *
(1 + r * m): `r` is what each guess column adds relative to a pass without guesses. On
an Apple GPU a pass reads the weights once whatever its width, so r is small; on a CPU
a batch's pass is bound by arithmetic, so a column costs about as much as the pass
itself and drafting rarely pays. `r` is measured per batch size (a larger batch's is
larger); until a size has one, the nearest measured size's serves, grown in proportion
where that size is smaller, and with none, r = 1 (a guess as dear as a token: no drafting
until a probe measures it).

Acceptance is a geometric fit (each guess kept with probability alpha), fed by the
guesses that ran and by shadow guesses: while the batch doesn't draft, prompt lookup
still guesses (a dictionary look-up, no model pass) and its guesses are checked against
the tokens that come out, so a workload that starts repeating itself is seen at once.
A width is drafted only where it is expected to give MARGIN more tokens per second than
no guesses; probes (a pass one or two guesses wide, ever rarer while they don't pay)
measure r where it isn't known yet, and only while the acceptance seen would pay were
guesses free: where the shadows show guesses refused, there are no probes at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MARGIN = 0.1  # drafting must be expected to win by this much (timings are noisy)
PROBE_EVERY = 16  # passes between probes while drafting doesn't pay, at first ...
PROBE_MAX = 512  # ... doubling after each probe that didn't pay, up to this
PROBE_WIDTH = 2
FIRST_PROBE = 4  # passes before the first: a plain pass's time must be known first
DECAY = 0.8


@dataclass
class Shared:
    """What every batch size's governor learns together."""
    max_draft: int
    kept: float = 1.0  # decayed counts; prior alpha 0.5
    refused: float = 1.0
    plain: dict[int, float] = field(default_factory=dict)  # size -> seconds, no guesses
    r: dict[int, float] = field(default_factory=dict)  # size -> relative cost per guess

    @property
    def alpha(self) -> float:
        return self.kept / (self.kept + self.refused)

    def accept(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.kept = DECAY * self.kept + accepted
            self.refused = DECAY * self.refused + (1 if accepted < drafted else 0)

    def nearest(self, table: dict[int, float], size: int) -> float | None:
        if not table:
            return None
        return table[min(table, key=lambda s: (abs(s - size), -s))]

    def cost(self, size: int) -> float | None:
        """A guess column's cost at `size`: as measured there, else the nearest size's,
        grown in proportion where that size is smaller (up to a whole pass): a column
        costs more in a larger batch (on a CPU about in proportion), and a batch that
        keeps changing (requests coming and going) may go long without a pass timed alone
        at its size, drafting all along on a smaller batch's cheaper figure."""
        if not self.r:
            return None
        if size in self.r:
            return self.r[size]
        near = min(self.r, key=lambda s: (abs(s - size), -s))
        r = self.r[near]
        return max(r, min(1.0, r * size / near)) if near < size else r

    def ratio(self, size: int, m: int, lengths: list[int], r: float | None = None) -> float:
        """Expected tokens per second with `m` guesses over that without any (`r`: the
        cost of a guess column, if not as measured)."""
        r = self.cost(size) if r is None else r
        r = 1.0 if r is None else r
        alpha = min(self.alpha, 0.999)
        tokens = sum((1 - alpha ** (min(m, n) + 1)) / (1 - alpha) for n in lengths)
        return tokens / len(lengths) / (1 + r * m)

    def best(self, size: int, top: int, lengths: list[int] | None = None) -> int:
        lengths = lengths or [top] * size
        m = max(range(top + 1), key=lambda w: (self.ratio(size, w, lengths), -w))
        return m if m and self.ratio(size, m, lengths) >= 1 + MARGIN else 0


class BatchGovernor:
    """The governor of passes over `size` sequences (Governor's interface, which
    engine/runtime/speculative.py batch_guesses and the group scheduler use)."""

    def __init__(self, shared: Shared, size: int):
        self.shared, self.size = shared, size
        self.passes = 0
        self.chose = False  # the last length was the best one (not a probe)
        self.drafted = self.accepted = 0  # totals, for the stats line and tests
        self.probes = 0
        # probes back off per size: one row drafting (cheap there) must not bring probes
        # back to a 16-row batch whose guesses were measured to cost a whole pass
        self.probe_every, self.next_probe = PROBE_EVERY, FIRST_PROBE

    @property
    def alpha(self) -> float:
        return self.shared.alpha

    def length(self, limit: int, cap: int | None = None, force: bool = False) -> int:
        """Guesses each sequence may ask for in the next pass (see Governor.length)."""
        sh = self.shared
        self.passes += 1
        self.chose = False
        top = min(limit, sh.max_draft if cap is None else cap)
        if top <= 0:
            return 0
        if force:
            return top
        best = sh.best(self.size, top)
        if best:
            self.chose = True
            self.probe_every, self.next_probe = PROBE_EVERY, self.passes + PROBE_EVERY
            return best
        if self.passes >= self.next_probe and sh.plain and \
                sh.ratio(self.size, min(PROBE_WIDTH, top), [top] * self.size, 0.0) \
                >= 1 + MARGIN:  # (were guesses free, would these pay? else why probe)
            self.next_probe = self.passes + self.probe_every
            self.probe_every = min(2 * self.probe_every, PROBE_MAX)
            self.probes += 1
            return min(PROBE_WIDTH, top)
        return 0

    def width(self, lengths: list[int]) -> int:
        """The pass's width once each sequence's guesses are known (0 for riders)."""
        top = max(lengths, default=0)
        return self.shared.best(self.size, top, lengths) if self.chose and top else top

    def observed_rows(self, rows: list[tuple[int, int]], width: int,
                      seconds: float) -> None:
        """A pass `width` guesses wide took `seconds` (0 wide: a pass without guesses);
        each drafting sequence's (guesses, kept)."""
        sh = self.shared
        if width == 0:
            before = sh.plain.get(self.size)
            sh.plain[self.size] = seconds if before is None else \
                DECAY * before + (1 - DECAY) * seconds
            return
        for drafted, accepted in rows:
            self.drafted += drafted
            self.accepted += accepted
            sh.accept(drafted, accepted)
        base = sh.nearest(sh.plain, self.size)
        if base:
            r = max(seconds / base - 1, 0.0) / width
            before = sh.r.get(self.size)
            sh.r[self.size] = r if before is None else DECAY * before + (1 - DECAY) * r

    def shadow(self, drafted: int, accepted: int) -> None:
        """Guesses made while not drafting, checked against what came out."""
        self.shared.accept(drafted, accepted)
