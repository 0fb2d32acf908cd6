"""Models already on this machine: Shoal's own models folder and the Hugging Face cache.

A folder counts as a model when mlx-lm could load it: a config.json with a model_type and
every safetensors file it needs present. Anything else is skipped with a log line, so one
half-downloaded or foreign folder never hides the others.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

Source = Literal["shoal", "hf-cache"]
_DTYPE_NAMES = {"BF16": "bf16", "F16": "f16", "F32": "f32", "bfloat16": "bf16",
                "float16": "f16", "float32": "f32"}


@dataclass(frozen=True)
class LocalModel:
    id: str  # Shoal folder name, or "org/name" for the Hugging Face cache
    path: Path
    source: Source
    size_bytes: int
    layers: int | None
    quantization: str  # "4-bit (group 32)", "bf16", ...
    model_type: str
    context_length: int | None
    # what it does (engine.modelconfig.capabilities): "generate", "vision", "embed", "rerank"
    capabilities: list[str] = field(default_factory=lambda: ["generate"])


def default_hf_cache() -> Path:
    """The Hugging Face hub cache, read from the environment at call time (HF_HUB_CACHE,
    then HF_HOME/hub) so a changed environment is honoured after import."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def list_local_models(models_dir: Path, hf_cache: Path | None = None) -> list[LocalModel]:
    """Every loadable model in `models_dir` (source "shoal") and the HF cache ("hf-cache")."""
    found: list[LocalModel] = []
    if Path(models_dir).is_dir():
        for folder in sorted(Path(models_dir).iterdir()):
            if folder.is_dir() and not folder.name.startswith("."):  # ".x.importing-..."
                model = _describe(folder, folder.name, "shoal")
                if model is not None:
                    found.append(model)
    cache = Path(hf_cache) if hf_cache is not None else default_hf_cache()
    if cache.is_dir():
        for repo in sorted(cache.glob("models--*")):
            snapshot = _snapshot(repo)
            if snapshot is not None:
                model = _describe(snapshot, _repo_id(repo.name), "hf-cache")
                if model is not None:
                    found.append(model)
    return found


def find_local_model(models_dir: Path, model_id: str,
                     hf_cache: Path | None = None) -> LocalModel | None:
    """The local model with this id (a Shoal folder first, then the HF cache), or None;
    None at once for an id no model can have (engine.hub.names.model_id_problem)."""
    from engine.hub.names import model_id_problem
    if model_id_problem(model_id):
        return None
    parts = model_id.split("/")
    if len(parts) == 1 and (Path(models_dir) / model_id).is_dir():
        model = _describe(Path(models_dir) / model_id, model_id, "shoal")
        if model is not None:
            return model
    cache = Path(hf_cache) if hf_cache is not None else default_hf_cache()
    repo = cache / ("models--" + model_id.replace("/", "--"))
    snapshot = _snapshot(repo) if repo.is_dir() else None
    return _describe(snapshot, model_id, "hf-cache") if snapshot is not None else None


def _repo_id(folder_name: str) -> str:
    return folder_name.removeprefix("models--").replace("--", "/", 1)


def _snapshot(repo: Path) -> Path | None:
    """The snapshot refs/main points at, else the newest one."""
    from engine.hub.hfcache import read_ref
    snapshots = repo / "snapshots"
    try:
        rev = read_ref(repo, "main")  # a commit hash, never a path
        if rev and (snapshots / rev).is_dir():
            return snapshots / rev
        candidates = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    except OSError as e:
        log.info("skipping %s: %s", repo, e)
        return None
    if not candidates:
        log.info("skipping %s: no snapshot", repo)
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime)


def why_unusable(folder: Path) -> str | None:
    """Why a folder in the models folder isn't listed as a model (None if it is one),
    naming files from the folder's own name on: the answer may go to a client, which
    has no business knowing where the models folder is."""
    try:
        _read(folder)
    except (OSError, ValueError) as e:
        return str(e).replace(str(folder), folder.name)
    return None


def _read(folder: Path) -> tuple[dict[str, Any], list[Path]]:
    """(config.json, weight files): ValueError naming the file that is damaged or missing."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{folder / 'config.json'} is not valid JSON ({e})") from None
    except FileNotFoundError:
        raise ValueError(f"{folder} has no config.json") from None
    if not isinstance(config, dict):
        raise ValueError(f"{folder / 'config.json'} is not a JSON object")
    if not isinstance(config.get("model_type"), str):
        raise ValueError(f"{folder / 'config.json'} has no model_type")
    return config, _weight_files(folder)


def _describe(folder: Path, model_id: str, source: Source) -> LocalModel | None:
    try:
        config, weights = _read(folder)
        model_type = str(config["model_type"])
        text = config.get("text_config")
        text = text if isinstance(text, dict) else {}  # multimodal configs nest the LM
        layers = config.get("num_hidden_layers", text.get("num_hidden_layers"))
        from engine.hub.checkpoint import model_context
        context = model_context(config)
        from engine.hub.gguf_source import model_files
        files = model_files(folder)
        size = sum(p.stat().st_size for p in files)
        from engine.modelconfig import capabilities
        return LocalModel(
            id=model_id, path=folder, source=source, size_bytes=size,
            layers=layers if isinstance(layers, int) else None,
            quantization=_quantization(config, weights),
            model_type=model_type,
            context_length=context if isinstance(context, int) else None,
            capabilities=capabilities(config, frozenset(p.name for p in files), model_id))
    except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
        log.info("skipping %s: not a loadable model (%s)", folder, e)
        return None


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files mlx-lm would load; ValueError when any is missing."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise ValueError("no model*.safetensors")
    missing = [p.name for p in files if not p.is_file()]  # also dangling cache symlinks
    if missing:
        raise ValueError(f"{', '.join(missing)} (named in {index.name}) "
                         f"{'is' if len(missing) == 1 else 'are'} missing")
    return files


def _quantization(config: dict[str, Any], weights: list[Path]) -> str:
    q = config.get("quantization") or config.get("quantization_config")
    if isinstance(q, dict) and "bits" in q:
        mode = q.get("mode", "affine")
        label = f"{q['bits']}-bit (group {q.get('group_size', 64)})"
        return label if mode == "affine" else f"{mode} {label}"
    if isinstance(q, dict) and q.get("quant_method"):
        return str(q["quant_method"])
    dtype = _largest_tensor_dtype(weights[0])
    if dtype is None:
        dtype = config.get("torch_dtype") or config.get("dtype")
    return _DTYPE_NAMES.get(str(dtype), str(dtype) if dtype else "unknown")


def _largest_tensor_dtype(file: Path) -> str | None:
    """The dtype of the biggest tensor, from the safetensors JSON header (no data read)."""
    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 << 20:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return None
    tensors = [v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    if not tensors:
        return None
    biggest = max(tensors, key=lambda v: v["data_offsets"][1] - v["data_offsets"][0])
    return biggest.get("dtype")
