"""modelconfig.capabilities, the one rule for what a checkpoint does, on real published
configs (../shared/reference/model-configs, read through tests/real_configs.py) and the
shapes of embedding and reranker folders."""

from __future__ import annotations

import pytest

from engine.modelconfig import capabilities
from real_configs import published


@pytest.mark.parametrize(("name", "does"), [
    ("google__gemma-3-27b-it", ["generate", "vision"]),
    ("mistralai__Mistral-Small-3.1-24B-Instruct-2503", ["generate", "vision"]),
    ("Qwen__Qwen3-8B", ["generate"]),
    ("google__gemma-3-1b-it", ["generate"]),  # the text-only Gemma 3 has no tower
    ("moonshotai__Kimi-K2.5", ["generate"]),  # its vision tower isn't one Shoal runs yet
])
def test_published_chat_and_vision_checkpoints(name: str, does: list[str]) -> None:
    assert capabilities(published(name)) == does


def test_embedding_and_reranker_folders() -> None:
    bert = {"model_type": "bert", "architectures": ["BertModel"]}
    assert capabilities(bert) == ["embed", "rerank"]
    assert capabilities({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]},
                        frozenset({"modules.json", "config.json"})) == ["embed", "rerank"]
    cross = {"model_type": "xlm-roberta", "architectures": ["XLMRobertaForSequenceClassification"]}
    assert capabilities(cross) == ["rerank"]
    qwen = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    assert capabilities(qwen, name="Qwen/Qwen3-Reranker-0.6B") == ["rerank"]
    assert capabilities(qwen, name="Qwen/Qwen3-0.6B") == ["generate"]
