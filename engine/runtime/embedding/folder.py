"""What an embedding or reranker model folder says about itself: its kind, its pooling
(sentence-transformers' 1_Pooling/config.json), its context. Pure reads, no MLX."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import CorruptModel, UnsupportedModel
from engine.modelconfig import context_length

# Families whose encoder mlx-embeddings runs (config model_type -> its module's name).
ENCODERS = {"bert": "bert", "xlm-roberta": "xlm_roberta", "xlm_roberta": "xlm_roberta",
            "roberta": "xlm_roberta"}
POOLINGS = ("mean", "cls", "lasttoken", "max")
_ST_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
               "pooling_mode_lasttoken": "lasttoken", "pooling_mode_max_tokens": "max"}
_ST_KNOWN = {"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
             "sentence_transformers.models.Normalize"}
_MAX_JSON = 1 << 20  # config files are a few KB; a huge one is not a model's


@dataclass(frozen=True)
class ModelSpec:
    """How to run a folder. kind: "embed" (pooled hidden states), "classify" (a
    cross-encoder's score head) or "yesno" (a causal LM judging a pair, Qwen3-Reranker)."""
    kind: str
    family: str  # "encoder" (mlx-embeddings) or "decoder" (mlx-lm)
    config: dict[str, Any]
    pooling: str
    context: int


def read_json(path: Path) -> Any:
    """A JSON file of the folder, or CorruptModel naming it."""
    try:
        if path.stat().st_size > _MAX_JSON:
            raise CorruptModel(f"{path.name} is larger than {_MAX_JSON} bytes.")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CorruptModel(f"Can't read {path}: {e}. Download the model again.") from e


def inside(folder: Path, rel: str) -> Path:
    """`rel` under `folder`, refusing a path (from a file of the folder) that leaves it."""
    path = (folder / rel).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise CorruptModel(f"modules.json points outside the model folder ({rel!r}).")
    return path


def st_pooling(folder: Path) -> str | None:
    """The pooling sentence-transformers' modules.json and its Pooling folder name, or None
    where the folder has no modules.json. UnsupportedModel for a module Shoal doesn't run
    (a Dense projection, several poolings concatenated): its vectors would be wrong."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = read_json(modules_file)
    if not isinstance(modules, list):
        raise CorruptModel("modules.json is not a list of modules.")
    pooling = None
    for module in modules:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        if kind not in _ST_KNOWN:
            raise UnsupportedModel(f"This embedding model has a {kind or 'strange'} module "
                                   "Shoal doesn't run (only Transformer, Pooling and "
                                   "Normalize). Use another embedding model.", param="model")
        if kind.endswith("Pooling"):
            cfg = read_json(inside(folder, str(module.get("path", ""))) / "config.json")
            modes = [name for key, name in _ST_POOLING.items() if cfg.get(key)]
            others = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v
                      and k not in _ST_POOLING]
            if len(modes) != 1 or others:
                raise UnsupportedModel("This embedding model pools with "
                                       f"{modes + others or 'nothing'}; Shoal pools with "
                                       "one of mean, cls, lasttoken or max.", param="model")
            pooling = modes[0]
    return pooling


def encoder_context(config: dict[str, Any]) -> int:
    """An encoder's usable positions: RoBERTa-style position ids start past the padding id."""
    n = context_length(config, 512)
    if config.get("model_type") in ("xlm-roberta", "xlm_roberta", "roberta"):
        n -= int(config.get("pad_token_id") or 1) + 1
    return n


def read_spec(model_dir: str | Path, name: str = "") -> ModelSpec:
    """How to run the model in `model_dir` (`name`, its id, tells a Qwen3-Reranker that
    config.json alone calls a causal LM)."""
    folder = Path(model_dir)
    config = read_json(folder / "config.json")
    if not isinstance(config, dict):
        raise CorruptModel("config.json is not an object.")
    model_type = str(config.get("model_type") or "")
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    encoder = model_type in ENCODERS
    pooling = st_pooling(folder)
    classify = any(a.endswith("ForSequenceClassification") for a in archs)
    reranker_name = "reranker" in f"{name} {folder.name}".lower()
    if classify:
        kind = "classify"
    elif pooling is not None or encoder:
        kind = "embed"
    elif reranker_name and any(a.endswith("ForCausalLM") for a in archs):
        kind = "yesno"
    else:
        raise UnsupportedModel(f"{folder.name} is not an embedding or reranker model "
                               f"({model_type or 'no model_type'}).", param="model")
    if encoder:
        return ModelSpec(kind, "encoder", config, pooling or "mean", encoder_context(config))
    if model_type in ("modernbert", "nomic_bert", "distilbert", "new"):
        raise UnsupportedModel(f"Shoal doesn't run {model_type} embedding models yet "
                               "(BERT, RoBERTa and XLM-RoBERTa encoders, and decoder "
                               "models such as Qwen3-Embedding, it does).", param="model")
    return ModelSpec(kind, "decoder", config, pooling or "lasttoken", context_length(config))
