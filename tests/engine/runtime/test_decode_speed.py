"""The tokens/s an answer reports is what a stopwatch shows over its decode, whichever path
served it: one request alone (mlx-lm's stream_generate), batched (mlx-lm's
BatchGenerator) and a group's lockstep: the tokens after the first over the time since the
first. Counting the first token too (mlx-lm's figure) makes a four-token answer look a
third faster than it is."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine.runtime.generate import build_prompt, decode_tps
from tests.tiny import make_tiny_model

TOKENS = 4  # counting the first token too would read 4/3 of the stopwatch's figure


def test_decode_tps_counts_the_tokens_after_the_first():
    assert decode_tps(1, 0.5) == 0.0
    assert decode_tps(3, 0.5) == 4.0
    assert decode_tps(3, 0.0) == 0.0


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, dict]:
    from engine.runtime.load import load_model

    # wide enough that a decode step takes milliseconds, not microseconds
    folder = make_tiny_model(tmp_path_factory.mktemp("speed") / "m", hidden_size=512,
                             intermediate_size=2048, num_hidden_layers=8)
    return load_model(folder)


def stopwatch(answers: Callable[[], Iterator[Any]]) -> float:
    """Reported tokens/s over the stopwatch's, the median of five answers."""
    ratios = []
    for _ in range(5):
        times, records = [], []
        for r in answers():
            times.append(time.perf_counter())
            records.append(r)
        assert records[-1].generation_tokens == TOKENS
        ratios.append(records[-1].generation_tps / ((TOKENS - 1) / (times[-1] - times[0])))
    return statistics.median(ratios)


def prompt(tok: Any) -> list[int]:
    return build_prompt(tok, [{"role": "user", "content": "how fast?"}])


def test_one_request_alone(loaded):
    from engine.runtime.generate import generate
    from engine.runtime.sampling import Sampling

    model, tok, _ = loaded
    ratio = stopwatch(lambda: generate(model, tok, prompt(tok), Sampling(max_tokens=TOKENS)))
    assert 0.8 < ratio < 1.2


def test_batched(loaded):
    from engine.runtime.sampling import Sampling
    from engine.runtime.text_engine import one_process_generator

    model, tok, config = loaded
    gen, streams = one_process_generator(model, tok, config, 2, 0)
    assert streams == 2
    ratio = stopwatch(lambda: gen(model, tok, prompt(tok), Sampling(max_tokens=TOKENS)))
    assert 0.8 < ratio < 1.2


class InProcessRunner:
    """Stands in for a group's ranks (which need processes and a ring): the whole model
    runs here, one token at a time, as rank 0's Runner hands out logits."""

    def __init__(self, model: Any):
        self.model = model

    def start(self, prompt: list[int], sampling: Any, done: Any = None) -> Any:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        self.cache = make_prompt_cache(self.model)
        return self._run(mx.array([prompt]))

    def next(self, token: int) -> Any:
        import mlx.core as mx

        return self._run(mx.array([[token]]))

    def end(self) -> None:
        self.cache = None

    def _run(self, x: Any) -> Any:
        import mlx.core as mx

        logits = self.model(x, cache=self.cache)[:, -1, :]
        mx.eval(logits)
        return logits


def test_lockstep(loaded):
    from engine.runtime.group.lockstep import generate
    from engine.runtime.sampling import Sampling

    model, tok, _ = loaded
    runner = InProcessRunner(model)
    ratio = stopwatch(lambda: generate(runner, tok, prompt(tok), Sampling(max_tokens=TOKENS)))
    assert 0.8 < ratio < 1.2
