"""A tensor rank reads only its slice of each split weight, and gets exactly the weights
MLX's own slicing gives. shard() needs only a group's size and rank to slice weights, so
these in-process checks hand it a stand-in group with those two numbers (the real 2-rank
group runs in test_distributed.py); nothing here communicates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from families import make_family_model  # noqa: E402


class Group:
    """size() and rank(): all that slicing reads of an MLX group."""

    def __init__(self, n: int, r: int):
        self.n, self.r = n, r

    def size(self) -> int:
        return self.n

    def rank(self) -> int:
        return self.r


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "deepseek_v3", "qwen3_5"])
@pytest.mark.parametrize("rank", [0, 1])
def test_slices_read_from_disk_equal_mlx_slicing(tmp_path, family, rank):
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    from engine.runtime.slice_read import Sources, remember_loads, slice_reads

    folder = make_family_model(tmp_path / family, family)
    want_model, _ = load_model(folder, lazy=True)
    want_model.shard(Group(2, rank))
    want = dict(tree_flatten(want_model.parameters()))

    sources = Sources()
    with remember_loads(sources):
        model, _ = load_model(folder, lazy=True)
    with slice_reads(sources):
        model.shard(Group(2, rank))
    got = dict(tree_flatten(model.parameters()))
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and mx.array_equal(got[k], want[k]).item(), k
    assert sources.bytes_read > 0  # some weights came from the file as slices


def test_a_wide_model_rank_reads_about_half(tmp_path):
    from engine.runtime.shard_load import load_tensor_shard
    from tiny import LLAMA, make_tiny_model

    folder = make_tiny_model(tmp_path / "wide", LLAMA, hidden_size=512, intermediate_size=2048,
                             num_attention_heads=8, num_key_value_heads=4)
    weights = (folder / "model.safetensors").stat().st_size
    _, _, info = load_tensor_shard(folder, Group(2, 1))
    assert info.bytes_read < 0.65 * weights, (info.bytes_read, weights)


def test_a_quantized_rank_reads_its_slice_packed_and_unpacks_only_that(tmp_path,
                                                                          monkeypatch):
    """An MLX 4-bit checkpoint: packed weights and their scales are read as this rank's
    slices, and the CPU path unpacks the slices, giving exactly what unpacking MLX's own
    slices of the whole weights gives."""
    import json

    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    from engine.runtime.load import cpu_fast_path
    from engine.runtime.shard_load import load_tensor_shard
    from tiny import LLAMA, make_tiny_model

    monkeypatch.setenv("SHOAL_CPU_DEQUANTIZE", "1")
    folder = make_tiny_model(tmp_path / "wide4", LLAMA, hidden_size=512,
                             intermediate_size=2048, num_attention_heads=8,
                             num_key_value_heads=4)
    model, config = load_model(folder)
    nn.quantize(model, group_size=64, bits=4)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config["quantization"] = {"group_size": 64, "bits": 4, "mode": "affine"}
    (folder / "config.json").write_text(json.dumps(config))
    size = (folder / "model.safetensors").stat().st_size

    got_model, _, info = load_tensor_shard(folder, Group(2, 1))
    assert info.bytes_read < 0.65 * size, (info.bytes_read, size)
    assert not any(hasattr(m, "bits") for _, m in got_model.named_modules())

    want_model, _ = load_model(folder, lazy=True)
    want_model.shard(Group(2, 1))
    want = dict(tree_flatten(cpu_fast_path(want_model).parameters()))
    got = dict(tree_flatten(got_model.parameters()))
    assert got.keys() == want.keys()
    for k in want:
        assert mx.array_equal(got[k], want[k]).item(), k
