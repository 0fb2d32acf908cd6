"""Generation in lockstep across the ranks of a group.

mlx-lm's generate_step keeps one step in flight; starting a collective while the previous
step's collectives are still running gave silently wrong logits. Here every step is
evaluated completely (mx.eval) before the next communication starts, and every MLX
send/recv/all_sum is announced on the doorbell first so that no rank spins waiting.

Rank 0 turns the token ids its runner produces into the same `Record`s as
engine/runtime/generate.py, so the worker's request path is the same for one process or many.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.cluster.dist_config import DistConfig
from engine.runtime.generate import Record, decode_tps
from engine.runtime.group.distributed import Watchdog
from engine.runtime.group.doorbell import END, Doorbell
from engine.runtime.sampling import Sampling
from engine.runtime.stops import Shown

log = logging.getLogger(__name__)

PREFILL_STEP = 2048  # mlx-lm's prefill_step_size: the same chunks give the same numbers
DTYPES = ("float32", "float16", "bfloat16")
HEADER_LEN = 16


def prefill_chunks(n_prompt: int, step: int = PREFILL_STEP) -> list[int]:
    """Sizes of the prompt pieces processed before the last token, as mlx-lm chunks them."""
    sizes, left = [], n_prompt - 1
    while left > 0:
        sizes.append(min(step, left))
        left -= sizes[-1]
    return sizes


@dataclass(frozen=True)
class Header:
    """What rank 0 tells the group about a request (sent over MLX as int32[16])."""

    n_prompt: int
    hidden: int
    dtype: str
    sampling: Sampling
    n_cached: int = 0  # prompt tokens whose KV the prefix cache holds (rank 0 decided)
    n_keep: int = 0    # prefix cache entries rank 0 kept after the previous request
    n_prev: int = 0    # tokens of the previous request, sent after the prompt, to store

    def encode(self) -> Any:
        import mlx.core as mx
        import numpy as np

        s = self.sampling
        f = np.array([s.temperature, s.top_p, s.min_p, s.repetition_penalty or 0.0],
                     dtype=np.float32).view(np.int32)
        seed = (s.seed or 0) % (2**63)
        vals = [self.n_prompt, self.hidden, DTYPES.index(self.dtype), s.top_k, *f.tolist(),
                int(s.repetition_penalty is not None) | (int(s.seed is not None) << 1),
                seed & 0x7FFFFFFF, (seed >> 31) & 0x7FFFFFFF, (seed >> 62) & 1, s.max_tokens,
                self.n_cached, self.n_keep, self.n_prev]
        return mx.array(vals + [0] * (HEADER_LEN - len(vals)), dtype=mx.int32)

    @classmethod
    def decode(cls, arr: Any) -> Header:
        import numpy as np

        v = [int(x) for x in arr.tolist()]
        temp, top_p, min_p, rep = np.array(v[4:8], dtype=np.int32).view(np.float32).tolist()
        seed = v[9] | (v[10] << 31) | (v[11] << 62)
        sampling = Sampling(max_tokens=v[12], temperature=temp, top_p=top_p, top_k=v[3],
                            min_p=min_p, repetition_penalty=rep if v[8] & 1 else None,
                            seed=seed if v[8] & 2 else None)
        return cls(v[0], v[1], DTYPES[v[2]], sampling, v[13], v[14], v[15])


@dataclass
class Stats:
    """Where one request's time went on this rank (logged at its end, read by the benchmark)."""

    steps: int = 0
    compute_s: float = 0.0
    comm_s: float = 0.0   # inside MLX send/recv/all_sum
    wait_s: float = 0.0   # asleep on the doorbell, i.e. waiting for other ranks' compute
    bytes_sent: int = 0
    overlapped: int = 0   # rank 0's steps run while another lane's was on the next ranks
    t0: float = field(default_factory=time.perf_counter)

    def line(self, rank: int) -> str:
        total = time.perf_counter() - self.t0
        n = max(self.steps, 1)
        return (f"rank {rank} request stats: steps={self.steps} total_ms={total * 1e3:.1f} "
                f"compute_ms_per_step={self.compute_s / n * 1e3:.3f} "
                f"comm_ms_per_step={self.comm_s / n * 1e3:.3f} "
                f"wait_ms_per_step={self.wait_s / n * 1e3:.3f} bytes_sent={self.bytes_sent} "
                f"overlapped_steps={self.overlapped}")


class Link:
    """This rank's MLX communication: every call is announced or awaited on the doorbell,
    bounded by the watchdog and timed. An MLX error here means the group broke."""

    def __init__(self, cfg: DistConfig, group: Any, bell: Doorbell, watchdog: Watchdog,
                 on_broken: Callable[[int, str], None]):
        self.cfg, self.group, self.bell, self.watchdog = cfg, group, bell, watchdog
        self._on_broken = on_broken
        self.stats = Stats()

    def compute(self, *arrays: Any, collective: bool = False) -> None:
        """Evaluate this rank's work; with `collective` (tensor parallel layers hold
        all_sums) it is bounded by the watchdog like any other wait on peers."""
        import mlx.core as mx

        t = time.perf_counter()
        if collective:
            try:
                with self.watchdog.watch("a tensor parallel step", self.cfg.successor):
                    mx.eval(*arrays)
            except RuntimeError as e:
                self._on_broken(self.cfg.successor, f"a tensor parallel step failed ({e})")
        else:
            mx.eval(*arrays)
        self.stats.compute_s += time.perf_counter() - t

    def _comm(self, what: str, peer: int, out: Any) -> Any:
        import mlx.core as mx

        t = time.perf_counter()
        try:
            with self.watchdog.watch(what, peer):
                mx.eval(out)
        except RuntimeError as e:  # MLX reports a lost neighbour this way
            self._on_broken(peer, f"{what} failed ({e})")
        self.stats.comm_s += time.perf_counter() - t
        return out

    def send(self, x: Any, dst: int, op: bytes) -> None:
        """Ring `op` on the doorbell, then send `x` to the successor (or to rank 0)."""
        import mlx.core as mx

        self.bell.ring(op)
        self._comm(f"sending to {self.cfg.where(dst)}", dst,
                   mx.distributed.send(x, dst, group=self.group))
        self.stats.bytes_sent += x.nbytes

    def recv(self, shape: tuple[int, ...], dtype: Any, src: int) -> Any:
        import mlx.core as mx

        return self._comm(f"receiving from {self.cfg.where(src)}", src,
                          mx.distributed.recv(shape, dtype, src, group=self.group))

    def all_sum(self, x: Any) -> Any:
        import mlx.core as mx

        return self._comm("a collective with the group", self.cfg.successor,
                          mx.distributed.all_sum(x, group=self.group))

    def wait(self, busy: bool) -> bytes:
        """The next op from the predecessor. Inside a request (`busy`) the wait is bounded:
        the group is in lockstep and something must come within timeout_s."""
        t = time.perf_counter()
        if busy:
            with self.watchdog.watch(f"waiting for {self.cfg.where(self.cfg.predecessor)}",
                                     self.cfg.predecessor):
                op = self.bell.wait()
        else:
            op = self.bell.wait()
        self.stats.wait_s += time.perf_counter() - t
        return op

    def expect(self, want: bytes) -> None:
        op = self.wait(busy=True)
        if op != want:
            self._on_broken(self.cfg.predecessor, f"the group is out of step (expected "
                            f"{want!r}, got {op!r})")

    def fail(self, why: str) -> None:
        """The group can't go on (takes every rank down with the reason)."""
        self._on_broken(self.cfg.predecessor, why)

    def new_request(self) -> None:
        self.stats = Stats()

    def end_request(self) -> None:
        log.info(self.stats.line(self.cfg.rank))

    def end_round(self) -> None:
        """Rank 0 ends a request: END goes round the ring and comes back once every rank
        has dropped it."""
        import mlx.core as mx
        self.bell.ring(END)
        self.expect(END)
        mx.clear_cache()
        self.end_request()


class Runner(Protocol):
    """Rank 0's handle on the group: logits (1, vocab) for a prompt's last position, then
    for each token fed back."""

    def start(self, prompt: list[int], sampling: Sampling,
              done: Callable[[int], None] | None = None) -> Any: ...
    def next(self, token: int) -> Any: ...
    def end(self) -> None: ...


def generate(runner: Runner, tokenizer: Any, prompt: list[int], sampling: Sampling,
             cancel: threading.Event | None = None,
             progress: Callable[[int, int, int], None] | None = None) -> Iterator[Record]:
    """Records for `prompt`, exactly as engine.runtime.generate.generate yields them
    (mlx-lm's stream_generate semantics: EOS ends with "stop", max_tokens with "length").
    Sampling happens here, on rank 0, as mlx-lm's generate_step does it."""
    import mlx.core as mx

    from engine.runtime.rules import own_finish, stop_tokens
    from engine.runtime.sampling import token_sampler

    shown, ends = Shown(tokenizer, sampling), stop_tokens(sampling, tokenizer)
    sample = token_sampler(sampling, tokenizer, prompt)

    tic = time.perf_counter()
    started = False
    try:
        def done(at: int) -> None:  # each chunk is life to the node's stall watchdog
            if progress is not None:
                progress(getattr(runner, "cached", 0), at, len(prompt))
        logits = runner.start(prompt, sampling, done)
        started = True
        done(len(prompt))
        token, lp = sample(logits)
        # tokens run per second: a cached prefix isn't run (as mlx-lm counts it)
        prompt_tps = (len(prompt) - getattr(runner, "cached", 0)) / (time.perf_counter() - tic)
        tic = time.perf_counter()
        n = 0
        while True:
            own = own_finish(token, n + 1, sampling, ends)
            text, finish, hit = shown.step(token, own, cancel)
            yield Record(text=text, token=token, finish_reason=finish,
                         prompt_tokens=len(prompt), generation_tokens=n + 1,
                         prompt_tps=prompt_tps,
                         generation_tps=decode_tps(n + 1, time.perf_counter() - tic),
                         peak_memory_gb=mx.get_peak_memory() / 1e9, logprob=lp[0],
                         top_logprobs=lp[1], stop_sequence=shown.matched if hit else None,
                         cached_tokens=getattr(runner, "cached", 0))
            if finish is not None:
                return
            token, lp = sample(runner.next(token))
            n += 1
    finally:
        if started:
            runner.end()
