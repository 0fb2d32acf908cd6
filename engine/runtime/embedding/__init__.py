"""Embedding and reranker models behind the Engine seam (engine/runtime/engine.py).

`load_engine` reads the folder (folder.py: kind, pooling, context), loads the network
(models.py: mlx-embeddings' encoders, mlx-lm's decoders) and its tokenizer, and returns an
EmbeddingEngine ({"embed", "rerank"}) or a RerankEngine ({"rerank"}) (embedder.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import CorruptModel, ShoalError, UnsupportedModel
from engine.protocol import Loading
from engine.runtime.engine import Emit, Engine


def load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise CorruptModel(f"{folder.name}'s tokenizer can't be read ({e}).") from e


def load_engine(model_dir: str, args: Any, emit: Emit) -> Engine:
    """The engine for an embedding or reranker model folder, loaded. `args` is the worker's
    options (model_id, context_limit are read where present). Raises ShoalError saying what
    to do where it can't load."""
    from engine.runtime.embedding.embedder import EmbeddingEngine, RerankEngine
    from engine.runtime.embedding.folder import read_spec
    from engine.runtime.embedding.models import load_network

    folder = Path(model_dir)
    emit(Loading(0, 2))
    spec = read_spec(folder, str(getattr(args, "model_id", "") or ""))
    try:
        net = load_network(folder, spec)
    except ShoalError:
        raise
    except (KeyError, TypeError, ValueError) as e:  # a config its model code can't take
        raise UnsupportedModel(f"{folder.name} can't be loaded: {e}", param="model") from e
    emit(Loading(1, 2))
    tokenizer = load_tokenizer(folder)
    emit(Loading(2, 2))
    cls = EmbeddingEngine if spec.kind == "embed" else RerankEngine
    engine = cls(spec, net, tokenizer, getattr(args, "context_limit", None))
    return engine
