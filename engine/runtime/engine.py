"""The seam the worker drives: one `Engine` per loaded model, whatever kind it is.

The worker process (engine/runtime/worker.py) reads commands from its node and hands each
to its engine: Generate to `generate`, Embed to `embed`, Rerank to `rerank`. A cancel sets
the request's event, which the engine polls between steps. What an engine can do is its
`capabilities` (protocol.CAPABILITIES), sent to the node in Ready; a command it can't serve
is answered with a 400 that says which kind of model serves it.

`engine.runtime.factory.make_engine` picks the implementation for a model folder: a text
model (mlx-lm), a vision model (mlx-lm's language model with mlx-vlm's vision tower in
front), an embedding or reranker model; one process, or one rank of a group."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ClassVar

from engine.errors import BadRequest
from engine.protocol import (
    AdoptKV,
    Embed,
    GenerateRequest,
    Message,
    PrefillKV,
    RankReady,
    Rerank,
)

Emit = Callable[..., None]  # worker.Emitter: emit(message)


class Engine:
    """A loaded model behind the worker. Subclasses override what they can do."""

    capabilities: ClassVar[frozenset[str]] = frozenset()
    context_length: int = 0
    streams: int = 1  # requests served at once (each on its own thread when above 1)
    rank: RankReady | None = None  # a group's rank 0: what it loaded (sent in Ready)

    def generate(self, rid: str, request: GenerateRequest, cancel: threading.Event,
                 emit: Emit) -> None:
        """Serve one generation: Accepted, Progress, Delta..., then Done (or Error)."""
        raise self.refuse("generate")

    def embed(self, cmd: Embed, cancel: threading.Event, emit: Emit) -> None:
        """Answer with one Embedded (or Error)."""
        raise self.refuse("embed")

    def rerank(self, cmd: Rerank, cancel: threading.Event, emit: Emit) -> None:
        """Answer with one Ranked (or Error)."""
        raise self.refuse("rerank")

    def prefill_kv(self, cmd: PrefillKV, cancel: threading.Event, emit: Emit) -> None:
        """Write the KV of cmd.tokens to cmd.path (prefill here, decode on another node):
        answer with one KVWritten (or Error)."""
        raise self.refuse("prefill for another node")

    def adopt_kv(self, cmd: AdoptKV, cancel: threading.Event, emit: Emit) -> None:
        """Keep the KV another node wrote for cmd.tokens: answer with one KVAdopted."""
        raise self.refuse("decode what another node prefilled")

    def close(self, grace_s: float = 4.0) -> None:
        """Before the process ends: keep what should outlive it (the last answer's KV)."""

    def refuse(self, what: str) -> BadRequest:
        does = ", ".join(sorted(self.capabilities)) or "nothing"
        needs = {"generate": "a chat or text model", "embed": "an embedding model",
                 "rerank": "a reranker or embedding model"}.get(what, what)
        return BadRequest(f"This model can't {what}: it serves {does}. Use {needs}.",
                          param="model")

    def serves(self, cmd: Message) -> bool:
        return isinstance(cmd, (Embed, Rerank, PrefillKV, AdoptKV)) or hasattr(cmd, "request")
