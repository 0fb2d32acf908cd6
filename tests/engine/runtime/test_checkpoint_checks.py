"""What Shoal reads off a checkpoint before anything starts (engine/hub/checkpoint.py):
the context every part shows and enforces, the bytes the planner counts, and a refusal
naming the field or file for everything mlx-lm can't run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from checkpoints import write_checkpoint  # noqa: E402
from engine.errors import CorruptModel, ModelNotFound, UnsupportedModel  # noqa: E402
from real_configs import published  # noqa: E402

# As config.json declares it: text_config first, rope scaling where it reaches further,
# the family's default where nothing is declared (Gemma 3 27B: transformers' 131072).
CONTEXTS = {
    "meta-llama__Llama-3.1-8B-Instruct": 131072, "deepseek-ai__DeepSeek-V3": 163840,
    "moonshotai__Kimi-K2-Instruct": 131072, "moonshotai__Kimi-K2.5": 262144,
    "openai__gpt-oss-120b": 131072, "microsoft__Phi-3.5-mini-instruct": 131072,
    "google__gemma-3-27b-it": 131072, "google__gemma-3-1b-it": 32768,
    "mistralai__Mistral-Small-3.1-24B-Instruct-2503": 131072,
    "Qwen__Qwen3.5-397B-A17B": 262144, "Qwen__Qwen2.5-7B-Instruct": 32768,
    "allenai__OLMo-2-1124-7B-Instruct": 4096, "MiniMaxAI__MiniMax-M2.7": 204800,
}


@pytest.mark.parametrize("name, want", sorted(CONTEXTS.items()))
def test_the_context_is_the_one_the_config_declares(name, want):
    from engine.hub.checkpoint import model_context
    assert model_context(published(name)) == want


def test_yarn_added_to_a_config_extends_its_context():
    from engine.hub.checkpoint import model_context
    qwen = published("Qwen__Qwen2.5-7B-Instruct")
    qwen["rope_scaling"] = {"type": "yarn", "factor": 4.0,
                            "original_max_position_embeddings": 32768}
    assert model_context(qwen) == 131072  # as Qwen's model card says to extend it


def _tensor_bytes(folder: Path) -> int:
    from engine.hub.checkpoint import tensor_bytes
    return sum(tensor_bytes(f) for f in folder.glob("*.safetensors"))


def test_the_planner_counts_a_mixed_quantized_checkpoints_real_bytes(tmp_path):
    """Ring-mini: 4-bit with 8-bit gates, layers whose width the group doesn't divide
    left in bfloat16: the bytes on disk, not 4.5 bits times the parameters."""
    from engine.hub.checkpoint import memory_bytes, read_config
    from engine.placement.model import ModelSpec

    folder = write_checkpoint(tmp_path / "ring", "mlx-community__Ring-mini-linear-2.0-4bit",
                              shards=2)
    config = read_config(folder)
    real = memory_bytes(folder, config)
    assert real == _tensor_bytes(folder)
    spec = ModelSpec.from_config(config, weight_bytes=real)
    assert spec.bytes_per_param * spec.total_params == pytest.approx(real)
    assert spec.bytes_per_param != pytest.approx(ModelSpec.from_config(config).bytes_per_param)


def test_fp8_blocks_count_twice_their_size(tmp_path):
    """mlx-lm unpacks DeepSeek's FP8 blocks to bfloat16 as it loads them."""
    from engine.hub.checkpoint import memory_bytes, read_config, stored_bytes

    folder = write_checkpoint(tmp_path / "ds", "deepseek-ai__DeepSeek-V3")
    config = read_config(folder)
    assert memory_bytes(folder, config) == 2 * stored_bytes(folder)


@pytest.fixture
def llama(tmp_path) -> Path:
    return write_checkpoint(tmp_path / "llama", "meta-llama__Llama-3.1-8B-Instruct", shards=2)


def _edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, field, words", [
    ({"model_type": "llama9000"}, "model_type", "no model code"),
    ({"model_type": None}, "model_type", "no model_type"),
    ({"model_file": "modeling_custom.py"}, "model_file", "custom model code"),
    ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
     "quantization_config.quant_method", "bitsandbytes"),
    ({"quantization_config": {"quant_method": "compressed-tensors",
                              "format": "float-quantized"}},
     "quantization_config.format", "float-quantized"),
    ({"quantization": {"bits": 7, "group_size": 64}}, "quantization", "bits"),
])
def test_what_mlx_lm_cant_run_is_refused_naming_the_field(llama, changes, field, words):
    from engine.hub.checkpoint import inspect
    _edit_config(llama, **changes)
    with pytest.raises(UnsupportedModel) as e:
        inspect(llama)
    assert e.value.param == field and words in e.value.message, e.value.message


def test_a_rope_block_the_model_code_cant_build_is_named_at_load(llama):
    from engine.runtime.load import load_model
    _edit_config(llama, rope_scaling={"rope_type": "wobbly", "factor": 8.0})
    with pytest.raises(UnsupportedModel) as e:
        load_model(llama)
    assert e.value.param == "rope_scaling" and "wobbly" in e.value.message, e.value.message


def test_a_tokenizer_that_is_code_in_the_folder_is_refused(llama):
    from engine.hub.checkpoint import inspect
    tc = json.loads((llama / "tokenizer_config.json").read_text())
    tc["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    (llama / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(UnsupportedModel, match="tokenization_kimi.py") as e:
        inspect(llama)
    assert e.value.param == "tokenizer"


def test_damaged_files_are_named(llama):
    from engine.hub.checkpoint import inspect
    shard = llama / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptModel, match="model-00002-of-00002.safetensors.*truncated"):
        inspect(llama)
    shard.unlink()
    with pytest.raises(ModelNotFound, match="model-00002-of-00002.safetensors is missing"):
        inspect(llama)
    (llama / "config.json").write_text('{"model_type": "llama", "hidden_')
    with pytest.raises(CorruptModel, match="config.json is not valid JSON"):
        inspect(llama)


def test_a_pipeline_ranks_partial_copy_passes_the_node_check(llama):
    """A node that fetched only its layers' files holds part of the index's files."""
    from engine.hub.checkpoint import inspect
    (llama / "model-00002-of-00002.safetensors").unlink()
    assert inspect(llama, all_files=False).context == 131072


def test_the_end_of_turn_ids_of_generation_config_reach_the_tokenizer(llama):
    from engine.runtime.load import load_tokenizer, read_config
    (llama / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    tok = load_tokenizer(llama, read_config(llama))
    assert set(tok.eos_token_ids) >= {0, 2}
