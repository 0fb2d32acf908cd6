"""What the bundle leaves out of transformers. Shoal uses it only for tokenizers and chat
templates (through mlx-lm); the model code (PyTorch), trainers and pipelines would make the
analysis take ten minutes and the bundle hundreds of MB bigger."""

from __future__ import annotations

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


def transformers_excludes(package: Path) -> list[str]:
    """Module names to exclude, from the installed package folder `package`."""
    names = [f"transformers.{n}" for n in TOP_LEVEL]
    for f in sorted((package / "models").glob("*/*.py")):
        # models/auto's tables are read by transformers' docstring decorators: keep them
        if f.name.startswith(MODEL_FILE_PREFIXES) and f.parent.name != "auto":
            names.append(f"transformers.models.{f.parent.name}.{f.stem}")
    return names
