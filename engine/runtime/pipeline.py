"""Pipeline parallel: rank r runs layers [s_r, e_r) of any mlx-lm model whose layers are a
list (engine/runtime/stage.py runs each share through the model's own code). Hidden states
go rank → rank+1; the last rank sends its output back to rank 0, which runs the model's
own norm and head and samples, so every logits processor works as in one process.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.runtime.doorbell import END, REQUEST, STEP, TOKEN
from engine.runtime.generate import Sampling
from engine.runtime.lockstep import HEADER_LEN, Header, Link, prefill_chunks
from engine.runtime.stage import Stage

log = logging.getLogger(__name__)


class PipelineLeader:
    """Rank 0: embeds, runs its layers, sends hidden states on, gets the last rank's
    output back and turns it into logits."""

    def __init__(self, stage: Stage, link: Link, hidden: int, dtype: str):
        import mlx.core as mx

        self.stage, self.link, self.hidden, self.dtype = stage, link, hidden, dtype
        self._dtype = getattr(mx, dtype)
        self.cache: list[Any] = []

    def _hop(self, tokens: list[int], logits: bool = True) -> Any:
        import mlx.core as mx

        link, cfg = self.link, self.link.cfg
        h = self.stage(mx.array(tokens)[None], self.cache)
        h = h if h.dtype == self._dtype else h.astype(self._dtype)
        link.compute(h)
        link.send(h, cfg.successor, STEP)
        link.expect(TOKEN)
        link.stats.steps += 1
        out = link.recv((1, 1, self.hidden), self._dtype, cfg.predecessor)
        if not logits:
            return None
        y = self.stage.logits(out)[:, -1, :]
        link.compute(y)
        return y

    def start(self, prompt: list[int], sampling: Sampling) -> Any:
        """Logits for the prompt's last position (1, vocab)."""
        import mlx.core as mx

        link = self.link
        link.new_request()
        self.cache = self.stage.make_cache()
        link.send(Header(len(prompt), self.hidden, self.dtype, sampling).encode(),
                  link.cfg.successor, REQUEST)
        link.send(mx.array(prompt, dtype=mx.int32), link.cfg.successor, STEP)
        at = 0
        for n in prefill_chunks(len(prompt)):
            self._hop(prompt[at:at + n], logits=False)
            at += n
            mx.clear_cache()
        return self._hop(prompt[at:])

    def next(self, token: int) -> Any:
        return self._hop([token])

    def end(self) -> None:
        """Every rank drops the request; END comes back round the ring when all have."""
        self.cache = []
        self.link.end_round()


class PipelineFollower:
    """Ranks 1…n-1: asleep on the doorbell until the predecessor announces a tensor."""

    def __init__(self, stage: Stage, link: Link):
        self.stage, self.link = stage, link

    def serve(self) -> None:
        import mlx.core as mx

        link, cfg, stage = self.link, self.link.cfg, self.stage
        src, dst = cfg.predecessor, cfg.successor
        busy = False
        while True:
            op = link.wait(busy)
            if op == REQUEST:
                link.new_request()
                head = link.recv((HEADER_LEN,), mx.int32, src)
                hdr = Header.decode(head)
                link.expect(STEP)
                prompt = link.recv((hdr.n_prompt,), mx.int32, src)
                if not stage.last:
                    link.send(head, dst, REQUEST)
                    link.send(prompt, dst, STEP)
                # prompt chunks, then the last prompt token, then one token per step
                schedule = [1] + prefill_chunks(hdr.n_prompt)[::-1]
                stage.set_dtype(hdr.dtype)
                cache, dtype, busy = stage.make_cache(), getattr(mx, hdr.dtype), True
            elif op == STEP:
                n = schedule.pop() if schedule else 1
                h = stage(link.recv((1, n, hdr.hidden), dtype, src), cache)
                h = h if h.dtype == dtype else h.astype(dtype)
                link.stats.steps += 1
                if not stage.last:
                    link.compute(h)
                    link.send(h, dst, STEP)
                    continue
                out = h[:, -1:, :]  # rank 0 needs only the last position
                link.compute(out, [c.state for c in cache[stage.start:stage.end]])
                link.send(out, dst, TOKEN)
            elif op == END:
                link.bell.ring(END)  # on to the successor; the last rank's reaches rank 0
                cache, busy = [], False
                mx.clear_cache()
                link.end_request()
            else:
                log.warning("ignoring unknown doorbell op %r", op)
