"""Pipeline parallel: rank r runs layers [s_r, e_r) of any mlx-lm model whose layers are a
list; hidden states go rank → rank+1, the sampled token goes from the last rank to rank 0.

`Stage` is a small adapter written from the model's own sub-modules (embed_tokens, layers,
norm, lm_head or tied embeddings), so any split works, not only families where mlx-lm
has `pipeline()`. Family quirks (embedding scale, sliding-window layers, logit caps) live in
the few functions below; families not listed here are refused rather than run wrongly.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from engine.errors import UnsupportedModel
from engine.runtime.doorbell import END, REQUEST, STEP, TOKEN
from engine.runtime.generate import Sampling
from engine.runtime.lockstep import HEADER_LEN, Header, Link, prefill_chunks

log = logging.getLogger(__name__)

# mlx-lm model modules whose forward pass Stage reproduces (checked by test_pipeline_stage).
FAMILIES = ("llama", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "granite",
            "olmo2")


def family(model: Any) -> str:
    return type(model).__module__.rsplit(".", 1)[-1]


def _window(fam: str, inner: Any, i: int) -> int | None:
    """The attention window of global layer i (None: full attention)."""
    if fam == "llama" and getattr(inner.layers[i], "use_sliding", False):
        return inner.sliding_window
    if fam == "gemma3_text":
        p = inner.sliding_window_pattern
        return None if i % p == p - 1 else inner.window_size
    return None


class Stage:
    """Layers [start, end) of `model`, with the embedding on the first stage and the final
    norm and head on the last. Holds only those modules: the rest of the model is dropped
    (with lazily loaded weights, never read from disk)."""

    def __init__(self, model: Any, start: int, end: int):
        import mlx.nn as nn
        from mlx_lm.models.cache import make_prompt_cache

        fam = family(model)
        if fam not in FAMILIES:
            raise UnsupportedModel(f"Pipeline placement doesn't support {fam} models yet; "
                                   "run this model on one node or with tensor parallelism.")
        inner = getattr(model, "model", model)
        n = len(inner.layers)
        self.fam, self.args = fam, model.args
        self.start, self.end, self.first, self.last = start, end, start == 0, end == n
        self.modules = nn.Module()  # everything this rank holds, for eval and dequantize
        self.modules.layers = list(inner.layers[start:end])
        if self.first or (self.last and "lm_head" not in model):
            self.modules.embed_tokens = inner.embed_tokens
        if self.last:
            self.modules.norm = inner.norm
            if "lm_head" in model:
                self.modules.lm_head = model.lm_head
        self.windows = [_window(fam, inner, i) for i in range(start, end)]
        self._cache = make_prompt_cache(model)[start:end]  # empty: the per-layer kinds

    @property
    def layers(self) -> list[Any]:
        return self.modules.layers

    def make_cache(self) -> list[Any]:
        return copy.deepcopy(self._cache)

    def embed(self, tokens: Any) -> Any:
        import mlx.core as mx

        h = self.modules.embed_tokens(tokens)
        if self.fam in ("gemma", "gemma2"):
            h = h * (self.args.hidden_size**0.5)
        elif self.fam == "gemma3_text":
            h = h * mx.array(self.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
        elif self.fam == "granite":
            h = h * self.args.embedding_multiplier
        return h

    def __call__(self, h: Any, cache: list[Any]) -> Any:
        """Token ids (first stage) or hidden states in, hidden states out."""
        from mlx_lm.models.base import create_attention_mask

        if self.first:
            h = self.embed(h)
        masks: dict[int | None, Any] = {}
        for layer, c, w in zip(self.layers, cache, self.windows):
            if w not in masks:  # one mask per window kind, from the first such cache
                masks[w] = create_attention_mask(h, c, window_size=w,
                                                 return_array=self.fam == "gemma2")
            h = layer(h, masks[w], c)
        return h

    def logits(self, h: Any) -> Any:
        """Final norm and head (last stage only)."""
        import mlx.core as mx

        h = self.modules.norm(h)
        if "lm_head" in self.modules:
            out = self.modules.lm_head(h)
        else:
            out = self.modules.embed_tokens.as_linear(h)
        if self.fam == "gemma2":
            cap = self.args.final_logit_softcapping
            out = mx.tanh(out / cap) * cap
        elif self.fam == "granite":
            out = out / self.args.logits_scaling
        return out


def make_sampling(sampling: Sampling) -> tuple[Any, list[Any]]:
    """mlx-lm's sampler and logits processors for a request (seeded as generate.py does)."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    if sampling.seed is not None:
        mx.random.seed(sampling.seed % (2**63))
    sampler = make_sampler(temp=sampling.temperature, top_p=sampling.top_p,
                           min_p=sampling.min_p, top_k=sampling.top_k)
    return sampler, make_logits_processors(repetition_penalty=sampling.repetition_penalty)


class PipelineLeader:
    """Rank 0: embeds, runs its layers, sends hidden states on, gets the token back."""

    def __init__(self, stage: Stage, link: Link, hidden: int, dtype: str):
        import mlx.core as mx

        self.stage, self.link, self.hidden, self.dtype = stage, link, hidden, dtype
        self._dtype = getattr(mx, dtype)
        self.cache: list[Any] = []

    def _hop(self, tokens: list[int]) -> int:
        import mlx.core as mx

        link, cfg = self.link, self.link.cfg
        h = self.stage(mx.array(tokens)[None], self.cache)
        h = h if h.dtype == self._dtype else h.astype(self._dtype)
        link.compute(h)
        link.send(h, cfg.successor, STEP)
        link.expect(TOKEN)
        link.stats.steps += 1
        return int(link.recv((1,), mx.int32, cfg.predecessor).item())

    def start(self, prompt: list[int], sampling: Sampling) -> int:
        import mlx.core as mx

        link = self.link
        link.new_request()
        self.cache = self.stage.make_cache()
        link.send(Header(len(prompt), self.hidden, self.dtype, sampling).encode(),
                  link.cfg.successor, REQUEST)
        link.send(mx.array(prompt, dtype=mx.int32), link.cfg.successor, STEP)
        at = 0
        for n in prefill_chunks(len(prompt)):
            self._hop(prompt[at:at + n])
            at += n
            mx.clear_cache()
        return self._hop(prompt[at:])

    def next(self, token: int) -> int:
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
                else:
                    sampler, processors = make_sampling(hdr.sampling)
                    history = prompt
                # prompt chunks (caches only), the last prompt token, then one per token
                chunks = [(n, True) for n in prefill_chunks(hdr.n_prompt)]
                schedule = [(1, False)] + chunks[::-1]
                cache, dtype, busy = stage.make_cache(), getattr(mx, hdr.dtype), True
            elif op == STEP:
                n, prefill = schedule.pop() if schedule else (1, False)
                h = stage(link.recv((1, n, hdr.hidden), dtype, src), cache)
                h = h if h.dtype == dtype else h.astype(dtype)
                link.stats.steps += 1
                if not stage.last:
                    link.compute(h)
                    link.send(h, dst, STEP)
                    continue
                if prefill:  # mlx-lm evaluates only the caches for prompt chunks
                    link.compute([c.state for c in cache])
                    y = mx.zeros((1,), mx.int32)
                else:
                    y = self._sample(stage.logits(h)[:, -1, :], history, sampler, processors)
                    link.compute(y)
                    if processors:
                        history = mx.concat([history, y])
                link.send(y.astype(mx.int32), dst, TOKEN)
            elif op == END:
                link.bell.ring(END)  # on to the successor; the last rank's reaches rank 0
                cache, busy = [], False
                mx.clear_cache()
                link.end_request()
            else:
                log.warning("ignoring unknown doorbell op %r", op)

    @staticmethod
    def _sample(logits: Any, history: Any, sampler: Any, processors: list[Any]) -> Any:
        import mlx.core as mx

        for p in processors:
            logits = p(history, logits)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return sampler(logprobs)
