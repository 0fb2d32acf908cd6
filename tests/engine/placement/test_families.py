"""The family rule's tables are the installed mlx-lm's own facts, and the rule says why."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from engine.placement.families import (
    REMAPPING,
    SPLIT_BY_SHOAL,
    TENSOR_FAMILIES,
    VOCAB_SHARDED,
    strategy_refusal,
)


def test_remapping_is_mlx_lms():
    from mlx_lm.utils import MODEL_REMAPPING
    assert REMAPPING == MODEL_REMAPPING


def test_tensor_families_are_exactly_those_with_shard():
    import mlx_lm.models

    have = set()
    for _, name, _ in pkgutil.iter_modules(mlx_lm.models.__path__):
        if name == "olmo":  # needs the ai2-olmo package just to import
            continue
        try:
            mod = importlib.import_module(f"mlx_lm.models.{name}")
        except ImportError:
            continue
        if hasattr(getattr(mod, "Model", None), "shard"):
            have.add(name)
    assert TENSOR_FAMILIES == have
    assert not SPLIT_BY_SHOAL & have  # Shoal's own splits only where mlx-lm has none
    assert VOCAB_SHARDED <= TENSOR_FAMILIES


@pytest.mark.parametrize("mtype,strategy,words", [
    ("phi3", "tensor", "phi3 models can't run tensor parallel"),
    ("gemma3_text", "tensor", "use pipeline"),  # (the 1B, text only; not the wrapper)
    ("gemma3n", "pipeline", "can't be split into a pipeline"),
])
def test_refusals_name_family_strategy_and_why(mtype, strategy, words):
    assert words in (strategy_refusal(mtype, strategy) or "")


@pytest.mark.parametrize("mtype", ["kimi_k2", "mistral", "deepseek_v3", "qwen3_5_moe",
                                   "glm4_moe", "gpt_oss", "minimax", "gemma3", "mistral3"])
def test_remapped_and_moe_families_split_both_ways(mtype):
    assert strategy_refusal(mtype, "pipeline") is None
    assert strategy_refusal(mtype, "tensor") is None


def test_a_family_new_to_shoal_runs_as_a_pipeline():
    assert strategy_refusal("some_future_family", "pipeline") is None
    assert "some_future_family" in (strategy_refusal("some_future_family", "tensor") or "")
