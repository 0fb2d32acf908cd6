"""Which engine serves a model this node runs alone: MLX, or llama.cpp where MLX would run
on the CPU (a Linux node without a GPU), the model came from a GGUF file that is still
there, and nothing asked for what only MLX does here (engine/runtime/llamacpp.py).

"auto" (the default; SHOAL_CPU_ENGINE sets the node's, a launch's "engine" its own) takes
llama.cpp where it can; "mlx" never; "llamacpp" insists, and is refused, naming why, where
it can't. A group's ranks, a prefill node's hand-over and a draft model run on MLX."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

from engine.errors import BadRequest
from engine.hub.bundled import bundled_gguf
from engine.hub.gguf_source import gguf_source

ENGINES = ("auto", "mlx", "llamacpp")


def node_default() -> str:
    asked = os.environ.get("SHOAL_CPU_ENGINE", "auto").strip().lower()
    return asked if asked in ENGINES else "auto"


@functools.cache
def mlx_on_cpu() -> bool:
    from engine.platform.device import mlx_backend
    return mlx_backend()[1] == "cpu"


@functools.cache
def installed() -> bool:
    """xllamacpp and the OpenMP library its wheel leaves to the system (libgomp1)."""
    import ctypes.util
    return importlib.util.find_spec("xllamacpp") is not None \
        and ctypes.util.find_library("gomp") is not None


def gguf_engine() -> str | None:
    """"llamacpp" where this node serves a GGUF import alone on llama.cpp by default (the
    planner counts its weights as the file has them), else None."""
    if node_default() == "mlx" or not mlx_on_cpu() or not installed():
        return None
    return "llamacpp"


def choose(asked: str, folder: Path, *, kv_bits: int | None = None,
           drafting: bool = False, handover: bool = False) -> str:
    """"mlx" or "llamacpp" for a model served alone from `folder`, as `asked` ("auto"
    follows the node's setting)."""
    asked = node_default() if asked == "auto" else asked
    if asked == "mlx":
        return "mlx"
    why = None
    if not mlx_on_cpu():
        why = "MLX runs on this machine's GPU, which is faster"
    elif not installed():
        why = "llama.cpp (xllamacpp) isn't installed here: run scripts/setup"
    elif gguf_source(folder, bundled_gguf()) is None:
        why = "the model wasn't imported from a GGUF file that is still on this machine"
    elif kv_bits:
        why = "quantized KV ('kv_bits') is MLX's"
    elif drafting:
        why = "this node drafts with a draft model, which is MLX's"
    elif handover:
        why = "a prefill node's hand-over ('prefill') is MLX's"
    if why is None:
        return "llamacpp"
    if asked == "llamacpp":
        raise BadRequest(f"'engine': llama.cpp can't serve this model here: {why}.",
                         param="engine")
    return "mlx"
