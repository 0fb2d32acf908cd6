"""What the bundle leaves out of transformers and mlx-vlm. Shoal uses transformers for
tokenizers, chat templates and the image processors of the vision families it runs; the
model code (PyTorch), trainers and pipelines would make the analysis take ten minutes and
the bundle hundreds of MB bigger. Of mlx-vlm it needs the loader and those families."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

# Per-model files Shoal never runs; configuration_* and tokenization_* stay for AutoTokenizer.
MODEL_FILE_PREFIXES = ("modeling_", "modular_", "image_processing_", "processing_",
                       "feature_extraction_", "video_processing_", "convert_", "generation_")
TOP_LEVEL = ("pipelines", "trainer", "trainer_callback", "trainer_pt_utils", "trainer_seq2seq",
             "training_args", "training_args_seq2seq", "modeling_utils", "modelcard",
             "optimization", "data", "commands", "cli", "distributed", "onnx", "sagemaker",
             "testing_utils", "debug_utils", "activations", "pytorch_utils", "masking_utils",
             "cache_utils", "modeling_flash_attention_utils", "modeling_layers",
             "modeling_outputs", "integrations.integration_utils", "generation.utils",
             "kernels", "loss", "quantizers")


# transformers' processors of the vision families (engine/modelconfig.VISION_FAMILIES):
# Gemma 3's uses SigLIP's image processor, Mistral 3's is Pixtral's; the Qwen families use
# mlx-vlm's Qwen3-VL processor, and Qwen3-VL MoE and Qwen3.5 MoE build on their dense kin.
VISION_PROCESSORS = {"gemma3": ("gemma3", "siglip"), "mistral3": ("mistral3", "pixtral"),
                     "qwen2_5_vl": ("qwen2_5_vl", "qwen3_vl"), "qwen3_vl": ("qwen3_vl",),
                     "qwen3_vl_moe": ("qwen3_vl_moe", "qwen3_vl"),
                     "qwen3_5_moe": ("qwen3_5_moe", "qwen3_5", "qwen3_vl")}
VISION_KEEP = ("image_processing_", "processing_")
# mlx-vlm's parts Shoal never runs and nothing it loads imports: its server, UIs, evals.
VLM_LEFT_OUT = ("server", "chat_ui", "chat", "evals", "__main__")


def transformers_excludes(package: Path, vision: Iterable[str] = ()) -> list[str]:
    """Module names to exclude, from the installed package folder `package`; the image
    processors of the `vision` families stay."""
    keep = {d for fam in vision for d in VISION_PROCESSORS.get(fam, (fam,))}
    names = [f"transformers.{n}" for n in TOP_LEVEL]
    for f in sorted((package / "models").glob("*/*.py")):
        # models/auto's tables are read by transformers' docstring decorators: keep them
        if f.name.startswith(MODEL_FILE_PREFIXES) and f.parent.name != "auto" \
                and not (f.parent.name in keep and f.name.startswith(VISION_KEEP)):
            names.append(f"transformers.models.{f.parent.name}.{f.stem}")
    return names


def vlm_keep(vision: Iterable[str], models: Path) -> Callable[[str], bool]:
    """collect_submodules' filter for mlx_vlm (`models`: its models folder): its loader
    and shared modules, and the model packages of the `vision` families (and the towers
    they build on)."""
    families = {d for fam in vision for d in VISION_PROCESSORS.get(fam, (fam,))}
    packages = {d.name for d in models.iterdir() if d.is_dir()}

    def keep(name: str) -> bool:
        parts = name.split(".")
        if len(parts) > 1 and parts[1] in VLM_LEFT_OUT:
            return False
        if len(parts) > 2 and parts[1] == "models":
            return parts[2] in families or parts[2] not in packages
        return True
    return keep
