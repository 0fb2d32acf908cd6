"""Loading a model folder in a worker: check files first so a damaged one is named,
then load through mlx-lm and materialise layer by layer to report progress."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import CorruptModel, ShardMismatch, UnsupportedModel
from engine.hub.checkpoint import read_config, weight_map
from engine.runtime.realize import flat, realize

if TYPE_CHECKING:
    import mlx.core as mx

log = logging.getLogger(__name__)


Progress = Callable[[int, int], None]


def lazy_model(folder: Path, files: list[str] | None = None,
               keep: Callable[[str], bool] | None = None
               ) -> tuple[Any, dict[str, Any], set[str]]:
    """(model, config, names of the tensors loaded into it) through mlx-lm's own loader
    (sanitize, quantization formats), reading no tensor yet. With `files`, over a view of
    the folder that shows only those weight files, and with `keep`, only the checkpoint's
    tensors it accepts reach the family's sanitize() (a pipeline rank's share: a file
    also holding a neighbour layer's tensors must not hand sanitize half a layer)."""
    import shutil
    import tempfile

    from mlx_lm.utils import _get_classes
    from mlx_lm.utils import load_model as mlx_load_model

    loaded: set[str] = set()

    def classes(config: dict[str, Any]) -> tuple[Any, Any]:
        cls, args = _get_classes(config)
        text = config.get("text_config")  # Qwen-VL configs say the head is untied once, at
        if isinstance(text, dict) and "tie_word_embeddings" in config:  # the top level
            text.setdefault("tie_word_embeddings", config["tie_word_embeddings"])

        def build(a: Any) -> Any:  # the model, telling which tensors the checkpoint gave
            try:
                model = cls(a)
            except (KeyError, TypeError, ValueError) as e:
                raise unbuildable(config, cls, e) from e
            real = model.load_weights

            def load_weights(weights: Any, strict: bool = True) -> Any:
                loaded.update(k for k, _ in weights)
                return real(weights, strict=strict)
            object.__setattr__(model, "load_weights", load_weights)
            if keep is not None:
                object.__setattr__(model, "sanitize", _share_sanitize(model, keep))
            return model
        return build, args

    if files is None:
        try:
            model, config = mlx_load_model(folder, lazy=True, get_model_classes=classes)
        except ValueError as e:
            raise mismatch(folder, e) from e
        return model, config, loaded
    view = Path(tempfile.mkdtemp(prefix="shoal-shard-"))
    try:
        for p in folder.iterdir():
            if p.suffix != ".safetensors" or p.name in files:
                (view / p.name).symlink_to(p.resolve())
        try:
            model, config = mlx_load_model(view, lazy=True, strict=False,
                                           get_model_classes=classes)
        except ValueError as e:
            raise mismatch(folder, e) from e
        return model, config, loaded
    finally:  # the lazy arrays keep their files open: the view can go now
        shutil.rmtree(view, ignore_errors=True)


def unbuildable(config: dict[str, Any], cls: Any, e: Exception) -> UnsupportedModel:
    """mlx-lm's model code failed on the config's values: name the block it read."""
    key = e.args[0] if isinstance(e, KeyError) and e.args else None
    text = str(e).lower()
    fields = {**config, **(config.get("text_config") or {})}
    field = next((k for k, v in fields.items() if isinstance(v, dict) and (
        k in text or ("rope" in k and ("rope" in text or key is not None)))), None)
    what = f"lacks {key!r}" if key is not None else f"has a value it can't use ({e})"
    module = cls.__module__.rsplit(".", 1)[-1]
    return UnsupportedModel(f"mlx-lm's {module} model can't be built from config.json: "
                            f"{field or 'it'} {what}.", param=field)


def mismatch(folder: Path, e: ValueError) -> ShardMismatch:
    """mlx-lm's refusal of the checkpoint's tensors, naming the files they are in."""
    import re

    text = " ".join(str(e).split())
    try:
        wmap = weight_map(folder)
    except (CorruptModel, OSError, ValueError):
        wmap = {}
    named = re.findall(r"[\w.]+\.(?:weight|bias|scales|biases)\b", text)
    files = sorted({wmap[n] for n in named if n in wmap})
    where = f"The model file{'s' if len(files) > 1 else ''} {', '.join(files)} in {folder}" \
        if files else f"The weights in {folder}"
    return ShardMismatch(f"{where} don't match config.json ({text[:300]}). The download is "
                         "damaged or mixed with another model's: download it again.")


def _share_sanitize(model: Any, keep: Callable[[str], bool]) -> Callable[[Any], Any]:
    """The family's sanitize() over the tensors `keep` accepts, then the adapters it needs
    on a pipeline rank (engine/runtime/adapters.py)."""
    from engine.runtime.adapters import after_sanitize

    real = getattr(model, "sanitize", None)

    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        weights = {k: v for k, v in weights.items() if keep(k)}
        try:
            out = real(weights) if real is not None else weights
        except KeyError as e:
            if real is None or "lm_head" not in str(e) \
                    or any("lm_head" in k for k in weights):
                raise
            # a rank without the head whose family's sanitize() moves it unconditionally
            # (mlx-lm's qwen3_vl_moe): hand it a stand-in, and take it out again
            import mlx.core as mx
            nested = any(k.startswith("model.language_model.") for k in weights)
            stub = "lm_head.weight" if nested else "language_model.lm_head.weight"
            out = {k: v for k, v in real({**weights, stub: mx.zeros((1,))}).items()
                   if "lm_head" not in k}
        return after_sanitize(model, out)
    return sanitize


def load_tokenizer(folder: Path, config: dict[str, Any]) -> Any:
    """mlx-lm's tokenizer wrapper, with every end-of-turn id of config.json and
    generation_config.json. Never runs code from the folder, and never asks on stdin."""
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    eos = config.get("eos_token_id")
    extra: dict[str, Any] = {"trust_remote_code": False}
    try:
        return mlx_load_tokenizer(folder, extra, eos_token_ids=eos)
    except (AttributeError, ValueError, KeyError, TypeError) as e:
        # transformers reads config.json only to pick the tokenizer class, and some real
        # configs trip it (kimi_k2's rope block under a type it doesn't know); when the
        # tokenizer files name their class, it needs no model config at all.
        if not _names_tokenizer_class(folder):
            raise CorruptModel(f"The tokenizer in {folder} couldn't be loaded: {e}") from e
        from transformers import PretrainedConfig
        log.info("tokenizer: loading without config.json (%s)", e)
        return mlx_load_tokenizer(folder, {**extra, "config": PretrainedConfig()},
                                  eos_token_ids=eos)


def _names_tokenizer_class(folder: Path) -> bool:
    try:
        tc = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(tc, dict) and isinstance(tc.get("tokenizer_class"), str)


def check_loaded(model: Any, loaded: set[str], wanted: Callable[[str], bool],
                 folder: Path) -> None:
    """Every weight this process keeps came from the checkpoint: a loader that skips a
    tensor (a partial view, a sanitize() that expects other names) would otherwise leave
    it at its random initial value, silently."""
    names = [k for k, _ in flat(model.parameters()) if wanted(k)]
    missing = [k for k in names if k not in loaded]
    if missing:
        raise ShardMismatch(f"The checkpoint in {folder} has no weights for "
                            f"{', '.join(missing[:4])}{' and others' if len(missing) > 4 else ''}"
                            f" ({len(missing)} of {len(names)}): its files don't match its "
                            "config.json, or are incomplete. Download the model again.")


def materialise(layers: list[Any], whole: Any, progress: Progress | None) -> None:
    """Read (and unpack) layer by layer, reporting progress, then the rest."""
    import mlx.core as mx

    for i, layer in enumerate(layers):
        mx.eval(layer.parameters())
        if progress:
            progress(i + 1, len(layers))
    mx.eval(whole.parameters())


def load_model(folder: Path, progress: Progress | None = None
               ) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, config). Every weight file is checked before loading."""
    from engine.hub.checkpoint import check_files, weight_files
    from engine.runtime.stage import layer_list

    config = read_config(folder)
    check_files(folder, weight_files(folder))
    model, _, loaded = lazy_model(folder)
    check_loaded(model, loaded, lambda k: True, folder)
    model = cpu_fast_path(model)
    try:
        layers = layer_list(model)
    except ValueError:
        layers = []
    materialise(layers, model, progress)
    realize(model)  # private arrays (RoPE tables) too: the batcher's thread runs it
    return model, load_tokenizer(folder, config), config


def cpu_fast_path(modules: Any, world: int = 1) -> Any:
    """On the CPU, when the float32 copy fits (see cpu.py): quantized layers unpacked and
    half-precision weights widened, both to float32. BLAS runs float32 only, and MLX's
    CPU expert kernel (gather_mm) takes nothing else, so a bf16 MoE couldn't run at all.
    Lazy: each layer is converted as it is read. `world`: ranks sharing the weights."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, get_total_parameters

    from engine.runtime import cpu_attention, cpu_exp

    # prefill attention, SwiGLU gates and the logits' normalising without MLX's slow CPU
    # exp (no-ops on a GPU)
    cpu_attention.install()
    cpu_exp.install()
    if not unpacks_on_cpu(modules, world):
        return modules
    quantized = any(hasattr(m, "bits") for _, m in modules.named_modules())
    fp32 = 4 * get_total_parameters(modules) // world
    log.info("CPU: %s to float32 (%.2f GB) for BLAS speed",
             "unpacking quantized weights" if quantized else "widening bf16/fp16 weights",
             fp32 / 1e9)
    if quantized:
        modules = _unquantize_sharded(dequantize_model(modules))
    modules.apply(lambda v: v.astype(mx.float32) if v.dtype in (mx.bfloat16, mx.float16)
                  else v)
    return modules


def unpacks_on_cpu(modules: Any, world: int = 1) -> bool:
    """Whether cpu_fast_path converts these weights (quantized or half precision, on the
    CPU, and the float32 copy of this rank's share fits)."""
    import mlx.core as mx
    from mlx_lm.utils import get_total_parameters

    from engine.platform.cpu import available_memory_bytes, should_dequantize

    quantized = any(hasattr(m, "bits") for _, m in modules.named_modules())
    half = any(v.dtype in (mx.bfloat16, mx.float16) for _, v in _leaves(modules))
    if not (quantized or half):
        return False
    return should_dequantize(4 * get_total_parameters(modules) // world,
                             mx.default_device() == mx.gpu, available=available_memory_bytes())


def _unquantize_sharded(modules: Any) -> Any:
    """Tensor parallel's quantized layers (what shard() made of quantized ones) as their
    plain counterparts, so a rank can read its slice packed and unpack only that."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.nn.layers import distributed as dist
    from mlx.utils import tree_unflatten

    plain = {dist.QuantizedAllToShardedLinear: dist.AllToShardedLinear,
             dist.QuantizedShardedToAllLinear: dist.ShardedToAllLinear}
    swaps = []
    for name, m in modules.named_modules():
        cls = plain.get(type(m))
        if cls is None:
            continue
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.group = m.group
        new.weight = mx.dequantize(m.weight, m.scales, m.get("biases"),
                                   group_size=m.group_size, bits=m.bits, mode=m.mode)
        if "bias" in m:
            new.bias = m.bias
        swaps.append((name, new))
    if swaps:
        modules.update_modules(tree_unflatten(swaps))
    return modules


def _leaves(modules: Any) -> list[tuple[str, Any]]:
    return flat(modules.parameters())
