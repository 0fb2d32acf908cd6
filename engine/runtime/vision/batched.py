"""Image requests in the Batcher: mlx-lm's BatchGenerator takes token ids only, so an
image request's prompt (but its last token) is prefilled here from its input embeddings,
one chunk per scheduler step between the batch's decode steps, as the BatchGenerator
chunks text prompts; then it joins the batch with that cache and decodes with the rest."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Fill:
    job: Any  # engine.runtime.batching.Job, with images
    cache: list[Any]
    done: int  # prompt tokens in `cache`
    embedded: Any = None  # the prompt's input embeddings from job.cached on
    started: bool = False


class Filling:
    """The image requests being prefilled, first come first served. Every call is on the
    Batcher's scheduler thread."""

    def __init__(self, model: Any, prefix: Any, chunker: Any, recurrent: bool,
                 prefilled: Callable[[int, int], Any]):
        self.model, self.prefix, self.chunker, self.recurrent = model, prefix, chunker, recurrent
        self.prefilled = prefilled  # batching.Prefilled: what a job's queue hears of it
        self.fills: list[Fill] = []

    def __len__(self) -> int:
        return len(self.fills)

    def add(self, job: Any, cache: list[Any]) -> None:
        self.fills.append(Fill(job, cache, job.cached))

    def step(self, alone: bool) -> tuple[Any, list[Any], int] | None:
        """One chunk of the first request's prefill; (job, cache, tokens in it) once all
        of its prompt but the last token is in."""
        import mlx.core as mx

        f = self.fills[0]
        job, end = f.job, len(f.job.prompt) - 1
        if not f.started:  # the vision tower runs once, at the request's first chunk
            f.embedded, f.started = job.images.embeddings(job.cached), True
        if f.done < end:
            n = min(self.chunker.size(alone=alone), end - f.done)
            tic = time.perf_counter()
            ids = mx.array([job.prompt[f.done:f.done + n]])
            with job.images.running():  # Qwen-VL: its 3-D positions (positions.py)
                if f.embedded is not None:
                    at = f.done - job.cached
                    self.model(ids, cache=f.cache,
                               input_embeddings=f.embedded[None, at:at + n])
                else:
                    self.model(ids, cache=f.cache)
            mx.eval([c.state for c in f.cache])
            self.chunker.took(n, time.perf_counter() - tic)
            f.done += n
            job.out.put(self.prefilled(job.cached, f.done))
        if f.done < end:
            return None
        self.fills.pop(0)
        if self.recurrent:  # the chat's next turn starts here
            self.prefix.snapshot(job.key, f.cache)
        return job, f.cache, f.done

    def fail(self, error: BaseException) -> None:
        """The first request's prefill failed: it ends with `error`."""
        self.fills.pop(0).job.out.put(error)

    def leave(self, job: Any) -> bool:
        """`job` leaves (its client went); what its chunks did stays for a retry. False
        when it isn't prefilling here."""
        for f in self.fills:
            if f.job is job:
                self.fills.remove(f)
                if f.done > job.cached:
                    self.prefix.partial(job.key[:f.done], f.cache)
                return True
        return False

    def sweep(self) -> None:
        """Those whose clients left go now (a retry sent at once finds what they did)."""
        for f in list(self.fills):
            if f.job.cancel is not None and f.job.cancel.is_set():
                self.leave(f.job)
