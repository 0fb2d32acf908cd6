"""Can this checkpoint run? Checked before anything starts, each refusal naming the field
or file: the model code mlx-lm has for its `model_type`, the fields that code needs, the
quantization format, the weight files, the tokenizer. Formats whose support depends on a
family's own loading code (FP8 blocks, compressed-tensors, ModelOpt, AWQ/GPTQ) are also
tried: mlx-lm builds the model lazily over the files' headers in a short child process,
reading no weights, and its answer is the rule.

Runs in the node (static checks import model code but make no arrays) and in workers.
"""

from __future__ import annotations

import functools
import json
import logging
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import CorruptModel, ModelNotFound, UnsupportedModel
from engine.modelconfig import context_length, declared_context, text_config

log = logging.getLogger(__name__)

QUANT_BITS = (2, 3, 4, 5, 6, 8)
QUANT_MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
# quantization_config methods mlx-lm's loader converts (mlx_lm/utils.py, load_model)
LOADER_METHODS = ("bitnet", "mxfp4", "mxfp8", "fp8", "compressed-tensors", "modelopt",
                  "awq", "gptq")
# ... of which these work only where the family's sanitize() takes their tensors
TRIED_METHODS = ("fp8", "compressed-tensors", "modelopt", "awq", "gptq", "bitnet")
COMPRESSED_FORMATS = ("pack-quantized", "nvfp4-pack-quantized", "mxfp4-pack-quantized")


@dataclass(frozen=True)
class Checkpoint:
    """What the checks found."""
    folder: Path
    config: dict[str, Any]
    module: str  # the mlx-lm model module that runs it, e.g. "deepseek_v3"
    context: int
    weight_files: tuple[str, ...]
    weight_bytes: int  # the tensors' bytes as stored (what MLX holds, unless unpacked)


def read_config(folder: Path) -> dict[str, Any]:
    """config.json, with generation_config.json's end-of-turn ids as mlx-lm merges them."""
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ModelNotFound(f"{folder} is not a model folder (no config.json).")
    try:
        config = json.loads(cfg.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptModel(f"The model file {cfg} is not valid JSON ({e}); the download "
                           "is incomplete or damaged: download the model again.") from e
    if not isinstance(config, dict):
        raise CorruptModel(f"The model file {cfg} is not a JSON object.")
    gen = folder / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        except (ValueError, UnicodeDecodeError, AttributeError):
            log.warning("ignoring %s: not a JSON object", gen)
            eos = None
        if eos:
            config["eos_token_id"] = eos
    return config


def check_safetensors(path: Path) -> None:
    """Raise CorruptModel naming `path` if its header is unreadable or the file is shorter
    than the header says (a truncated download or copy)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("file is shorter than a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > min(size - 8, 100_000_000):
                raise ValueError("header length is larger than the file")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CorruptModel(f"The model file {path} is damaged ({e}). Delete the model "
                           "folder and download or import it again.") from e
    if 8 + n + end != size:
        raise CorruptModel(f"The model file {path} is truncated or damaged: it holds "
                           f"{size} bytes, its header says {8 + n + end}. Delete the model "
                           "folder and download or import it again.")


def tensor_bytes(path: Path) -> int:
    """The bytes of the tensors in a (checked) safetensors file: its size less the header."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - n


def weight_map(folder: Path) -> dict[str, str]:
    """Tensor name → file name, from the index when there is one, else the headers."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            return dict(json.loads(index.read_text())["weight_map"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptModel(f"The model index {index} is damaged ({e}).") from e
    out: dict[str, str] = {}
    for f in sorted(folder.glob("model*.safetensors")):
        check_safetensors(f)
        with f.open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            out.update({k: f.name for k in json.loads(fh.read(n)) if k != "__metadata__"})
    if not out:
        raise ModelNotFound(f"{folder} holds no model*.safetensors weights.")
    return out


def model_classes(config: dict[str, Any]) -> tuple[Any, Any, str]:
    """(Model class, ModelArgs class, module name) mlx-lm uses for this config."""
    from mlx_lm.utils import _get_classes

    mtype = config.get("model_type")
    if not isinstance(mtype, str) or not mtype:
        raise UnsupportedModel("config.json has no model_type, so no model code can be "
                               "chosen for it.", param="model_type")
    if config.get("model_file"):
        raise UnsupportedModel(f"config.json asks for custom model code "
                               f"({config['model_file']!r}); Shoal runs only the model code "
                               "that comes with mlx-lm.", param="model_file")
    try:
        cls, args = _get_classes(config)
    except ValueError:
        raise UnsupportedModel(f"config.json says model_type {mtype!r}, and the installed "
                               f"mlx-lm ({_mlx_lm_version()}) has no model code for it. A "
                               "newer mlx-lm may; until then this model can't run.",
                               param="model_type") from None
    return cls, args, cls.__module__.rsplit(".", 1)[-1]


def model_args(config: dict[str, Any]) -> Any:
    """mlx-lm's ModelArgs for the config, or a refusal naming what it lacks."""
    cls, args_cls, module = model_classes(config)
    try:
        return args_cls.from_dict(config)
    except TypeError as e:  # missing required fields
        missing = str(e).split("arguments:", 1)[-1].strip() if "missing" in str(e) else str(e)
        where = (f": they are inside text_config, but model_type {config['model_type']!r} "
                 f"is mlx-lm's text-only {module} model, which reads them at the top level "
                 "(a wrapper of this kind needs the wrapper's model_type)"
                 if isinstance(config.get("text_config"), dict) else "")
        raise UnsupportedModel(f"config.json lacks fields mlx-lm's {module} model needs "
                               f"({missing}){where}.", param="model_type") from None
    except (ValueError, KeyError) as e:
        raise UnsupportedModel(f"mlx-lm's {module} model can't use this config.json: "
                               f"{e}.", param=_field_of(str(e))) from None


def _field_of(message: str) -> str | None:
    for field in ("rope_scaling", "rope_parameters", "quantization", "layer_types"):
        if field in message:
            return field
    return None


def _mlx_lm_version() -> str:
    from importlib.metadata import version
    return version("mlx-lm")


def check_quantization(config: dict[str, Any]) -> str | None:
    """Refuse a quantization format MLX can't load; "trial" when only trying tells."""
    q = config.get("quantization")
    if isinstance(q, dict):
        for key, v in q.items():
            if key in ("bits", "group_size", "mode"):
                continue
            if v is not False and not (isinstance(v, dict) and v.get("bits") in QUANT_BITS):
                raise UnsupportedModel(f"config.json's quantization[{key!r}] is {v!r}: a "
                                       "per-layer override must give bits "
                                       f"{'/'.join(map(str, QUANT_BITS))} and a group size, "
                                       "or false.", param="quantization")
        bits, group, mode = q.get("bits"), q.get("group_size"), q.get("mode", "affine")
        if bits not in QUANT_BITS or not isinstance(group, int) or group <= 0 \
                or mode not in QUANT_MODES:
            raise UnsupportedModel(f"config.json's quantization block ({json.dumps(q)[:200]}) "
                                   f"isn't one MLX loads: bits {'/'.join(map(str, QUANT_BITS))},"
                                   f" a group size, mode {'/'.join(QUANT_MODES)}.",
                                   param="quantization")
        return None
    qc = config.get("quantization_config") or \
        (config.get("text_config") or {}).get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = qc.get("quant_method")
    if method not in LOADER_METHODS:
        raise UnsupportedModel(f"quantization_config.quant_method is {method!r}, a format "
                               f"MLX can't load (it loads "
                               f"{', '.join(LOADER_METHODS)}). Use an MLX conversion of this "
                               "model (the mlx-community repositories on the Hub).",
                               param="quantization_config.quant_method")
    if method == "compressed-tensors" and qc.get("format") not in COMPRESSED_FORMATS:
        raise UnsupportedModel(f"quantization_config.format is {qc.get('format')!r}: MLX "
                               f"loads compressed-tensors only as "
                               f"{', '.join(COMPRESSED_FORMATS)}. Use an MLX conversion.",
                               param="quantization_config.format")
    return "trial" if method in TRIED_METHODS else None


def weight_files(folder: Path) -> list[Path]:
    """Every weight file the checkpoint names (its index, else the files present)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            wmap = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(wmap.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptModel(f"The model index {index} is damaged ({e}); download the "
                               "model again.") from e
        return [folder / n for n in names]
    files = sorted(folder.glob("model*.safetensors")) or sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"{folder} holds no .safetensors weights.")
    return files


def check_files(folder: Path, files: list[Path]) -> int:
    """Every file present and whole; the tensors' bytes."""
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelNotFound(f"The model folder {folder} is incomplete: "
                            f"{', '.join(missing[:5])}{' and others' if len(missing) > 5 else ''}"
                            f" {'is' if len(missing) == 1 else 'are'} missing (named in "
                            "model.safetensors.index.json). Download the model again.",
                            param="model")
    total = 0
    for f in files:
        check_safetensors(f)
        total += tensor_bytes(f)
    return total


def stored_bytes(folder: Path) -> int | None:
    """The checkpoint's tensor bytes: the index's total_size, else the files' (None when
    neither is known, e.g. a share of a checkpoint without an index)."""
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            total = json.loads(index.read_text(encoding="utf-8")).get("metadata", {}) \
                .get("total_size")
            if isinstance(total, (int, float)) and total > 0:
                return int(total)
        files = weight_files(folder)
        if all(f.is_file() for f in files):
            return sum(tensor_bytes(f) for f in files)
    except (OSError, ValueError, AttributeError, struct.error, ModelNotFound, CorruptModel):
        pass
    return None


def memory_bytes(folder: Path, config: dict[str, Any]) -> int | None:
    """What the weights take in memory once loaded: their stored bytes, but twice that for
    FP8 blocks, which mlx-lm's sanitize() unpacks to bfloat16 (not the mxfp8 kind)."""
    stored = stored_bytes(folder)
    qc = config.get("quantization_config") or \
        (config.get("text_config") or {}).get("quantization_config")
    if stored and isinstance(qc, dict) and qc.get("quant_method") == "fp8" and not (
            qc.get("scale_fmt") == "ue8m0"
            and list(qc.get("weight_block_size") or ()) == [32, 32]):
        return 2 * stored
    return stored


def check_tokenizer(folder: Path) -> None:
    """A tokenizer that loads without running code shipped in the model folder."""
    tc = folder / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if tc.is_file():
        try:
            config = json.loads(tc.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptModel(f"The model file {tc} is not valid JSON ({e}).") from e
    auto = config.get("auto_map") if isinstance(config, dict) else None
    custom = auto.get("AutoTokenizer") if isinstance(auto, dict) else auto
    if custom:
        code = custom[0] if isinstance(custom, list) else custom
        raise UnsupportedModel(f"This model's tokenizer is Python code shipped with it "
                               f"({str(code).split('.')[0]}.py, named by auto_map in "
                               f"{tc.name}); Shoal runs no code from model folders. An MLX "
                               "conversion with a tokenizer.json works.",
                               param="tokenizer")
    if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model",
                                                  "vocab.json", "tiktoken.model")):
        raise ModelNotFound(f"{folder} has no tokenizer (tokenizer.json or tokenizer.model); "
                            "download the model again.", param="model")


def default_context(config: dict[str, Any]) -> int | None:
    """The context a config that declares none has: its family's default (transformers'
    config class, as the Hub means an absent field), else mlx-lm's ModelArgs default."""
    if declared_context(config) is not None:
        return None
    text = text_config(config)
    mtype = str((config.get("text_config") or {}).get("model_type") or text.get("model_type"))
    if (v := _hub_default_context(mtype)) is not None:
        return v
    try:
        return getattr(model_args(text if "text_config" in config else config),
                       "max_position_embeddings", None)
    except UnsupportedModel:
        return None


@functools.lru_cache(maxsize=64)
def _hub_default_context(model_type: str) -> int | None:
    """transformers' default max_position_embeddings for a model type, if it has one."""
    try:
        from transformers import AutoConfig
        v = getattr(AutoConfig.for_model(model_type), "max_position_embeddings", None)
    except (ImportError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return v if isinstance(v, int) and v > 0 else None


def model_context(config: dict[str, Any]) -> int:
    """The model's context window as every part of Shoal shows and enforces it."""
    return context_length(config, default_context(config))


def inspect(folder: Path, trial: bool = True, all_files: bool = True) -> Checkpoint:
    """Every check above; the first failure is raised. `trial=False` skips the lazy trial
    build; `all_files=False` checks only the weight files present (a pipeline rank's node
    may hold only its share; its worker checks those it needs)."""
    folder = Path(folder)
    config = read_config(folder)
    _cls, _args, module = model_classes(config)
    model_args(config)
    needs_trial = check_quantization(config)
    check_tokenizer(folder)
    files = weight_files(folder)
    size = check_files(folder, files if all_files else [f for f in files if f.is_file()])
    if trial and needs_trial and all(f.is_file() for f in files):
        try_build(folder, config)
    return Checkpoint(folder, config, module, model_context(config),
                      tuple(f.name for f in files), size)


def try_build(folder: Path, config: dict[str, Any], timeout: float = 300) -> None:
    """mlx-lm builds the model over the headers (lazily, nothing read) in a child process;
    a failure is a refusal naming the quantization format."""
    try:
        out = subprocess.run([sys.executable, "-m", "engine.hub.checkpoint", str(folder)],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("the trial build of %s took over %.0f s; not checked", folder, timeout)
        return
    if out.returncode == 0:
        return
    why = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
    qc = config.get("quantization_config") or \
        (config.get("text_config") or {}).get("quantization_config") or {}
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    algo = qc.get("quant_algo") or qc.get("format") or ""
    raise UnsupportedModel(f"mlx-lm ({_mlx_lm_version()}) can't load this checkpoint's "
                           f"{method} {algo} weights for {config.get('model_type')} models "
                           f"(quantization_config): {why[:400]}. Use an MLX conversion of "
                           "this model (the mlx-community repositories on the Hub).",
                           param="quantization_config")


def _trial(folder: Path) -> int:
    """The child of try_build: 0 when mlx-lm builds the model strictly over the files."""
    from mlx_lm.utils import load_model

    try:
        load_model(folder, lazy=True, strict=True)
    except Exception as e:  # mlx-lm's own words are the reason
        print(" ".join(str(e).split())[:600], flush=True)
        return 1
    return 0


if __name__ == "__main__":
    import os
    os._exit(_trial(Path(sys.argv[1])))  # no teardown of MLX's threads (see worker.py)
