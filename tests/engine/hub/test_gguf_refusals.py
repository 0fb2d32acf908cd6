"""Files the importer must refuse: clearly, naming the file and what is supported, and
without leaving anything in the models folder."""

from __future__ import annotations

import errno
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_builder import (
    F32,
    IQ2_XS,
    Q4_K,
    Q8_0,
    Raw,
    gguf_metadata,
    nested_arrays,
    tiny_config,
    tiny_gguf_tensors,
    tiny_hf_weights,
    write_gguf,
    write_tiny_gguf,
)

import engine.hub.gguf as gguf_module
from engine.errors import BadRequest, CorruptModel, ShoalError, UnsupportedModel
from engine.hub.gguf import import_gguf
from engine.hub.gguf_reader import MAX_ARRAY_DEPTH, MAX_ARRAY_ITEMS, read_header

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def tiny() -> tuple[dict, list]:
    config = tiny_config("llama")
    tensors, _ = tiny_gguf_tensors(config, tiny_hf_weights(config), Q8_0)
    return config, tensors


def _assert_nothing_written(models: Path) -> None:
    assert not models.exists() or list(models.iterdir()) == []


@pytest.mark.parametrize("gtype,name,block_bytes", [(IQ2_XS, "IQ2_XS", 74), (11, "Q3_K", 110),
                                                    (10, "Q2_K", 84), (23, "IQ4_XS", 136)])
def test_unsupported_quantization_is_named(tmp_path: Path, tiny: tuple, gtype: int, name: str,
                                           block_bytes: int) -> None:
    config, tensors = tiny
    # 256-wide rows of super-blocks, as i-quant and low K-quant files hold them.
    tensors = [t if t[0] != "blk.0.ffn_down.weight"
               else (t[0], gtype, (64, 256), bytes(64 * block_bytes)) for t in tensors]
    path = write_gguf(tmp_path / "model.gguf", gguf_metadata(config), tensors)
    with pytest.raises(UnsupportedModel) as e:
        import_gguf(path, tmp_path / "models")
    assert str(e.value).startswith(f"model.gguf uses quantization {name} for "
                                   f"blk.0.ffn_down.weight")
    assert "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K" in str(e.value)
    _assert_nothing_written(tmp_path / "models")


def test_tensor_of_the_wrong_shape_is_refused_before_the_folder_appears(
        tmp_path: Path, tiny: tuple) -> None:
    config, tensors = tiny
    # Valid Q4_K blocks, but a row length (256) the header's 128-wide MLP doesn't have.
    tensors = [t if t[0] != "blk.0.ffn_down.weight"
               else (t[0], Q4_K, (64, 256), bytes(64 * 144)) for t in tensors]
    path = write_gguf(tmp_path / "model.gguf", gguf_metadata(config), tensors)
    with pytest.raises(CorruptModel, match="model.gguf does not form a model mlx-lm can load"):
        import_gguf(path, tmp_path / "models")
    _assert_nothing_written(tmp_path / "models")


def test_unknown_ggml_type_id_is_refused(tmp_path: Path, tiny: tuple) -> None:
    config, tensors = tiny
    tensors = [(n, 99 if n == "output_norm.weight" else t, s, b) for n, t, s, b in tensors]
    path = write_gguf(tmp_path / "model.gguf", gguf_metadata(config), tensors)
    with pytest.raises(UnsupportedModel, match="quantization type 99 for output_norm.weight"):
        import_gguf(path, tmp_path / "models")


@pytest.mark.parametrize("arch", ["falcon", "deepseek2", "gemma2"])
def test_unsupported_architecture_is_named(tmp_path: Path, tiny: tuple, arch: str) -> None:
    config, tensors = tiny
    meta = gguf_metadata(config) | {"general.architecture": arch}
    path = write_gguf(tmp_path / "g.gguf", meta, tensors)
    with pytest.raises(UnsupportedModel, match=f"g.gguf is a {arch} model; .*llama, mistral, "
                                               f"qwen2, qwen3, qwen3moe, gemma3, phi3"):
        import_gguf(path, tmp_path / "models")
    _assert_nothing_written(tmp_path / "models")


def test_moe_layer_without_experts_or_mlp_is_corrupt(tmp_path: Path) -> None:
    config = tiny_config("qwen3_moe")
    tensors, _ = tiny_gguf_tensors(config, tiny_hf_weights(config))
    tensors = [t for t in tensors if not t[0].startswith("blk.1.ffn_gate_exps")]
    path = write_gguf(tmp_path / "moe.gguf", gguf_metadata(config), tensors)
    with pytest.raises(CorruptModel, match=r"moe.gguf lacks .* blk.1.ffn_gate_exps.weight \(1 mis"):
        import_gguf(path, tmp_path / "models")


def test_extra_tensor_of_another_variant_is_refused(tmp_path: Path, tiny: tuple) -> None:
    config, tensors = tiny
    extra = ("blk.0.attn_q_norm.weight", F32, (16,), bytes(64))  # a Qwen3-style QK norm
    path = write_gguf(tmp_path / "x.gguf", gguf_metadata(config), tensors + [extra])
    with pytest.raises(UnsupportedModel, match="tensor blk.0.attn_q_norm.weight"):
        import_gguf(path, tmp_path / "models")


def test_rope_factors_not_from_llama3_are_refused(tmp_path: Path, tiny: tuple) -> None:
    config, tensors = tiny
    freqs = struct.pack("<8f", 1, 3, 1, 3, 1, 3, 1, 3)
    path = write_gguf(tmp_path / "r.gguf", gguf_metadata(config),
                      tensors + [("rope_freqs.weight", F32, (8,), freqs)])
    with pytest.raises(UnsupportedModel, match="don't follow Llama 3's rule"):
        import_gguf(path, tmp_path / "models")
    _assert_nothing_written(tmp_path / "models")


def test_missing_tensor_is_corrupt(tmp_path: Path, tiny: tuple) -> None:
    config, tensors = tiny
    tensors = [t for t in tensors if t[0] != "blk.1.ffn_up.weight"]
    path = write_gguf(tmp_path / "m.gguf", gguf_metadata(config), tensors)
    with pytest.raises(CorruptModel, match="m.gguf lacks tensors .*blk.1.ffn_up.weight"):
        import_gguf(path, tmp_path / "models")


@pytest.mark.parametrize("keep", [10, 30, 2000, -100])
def test_truncated_file_is_corrupt_and_named(tmp_path: Path, tiny: tuple, keep: int) -> None:
    config, _ = tiny
    full, _ = write_tiny_gguf(tmp_path / "full.gguf", config, tiny_hf_weights(config))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes()[:keep])
    with pytest.raises(CorruptModel, match="cut.gguf is truncated"):
        import_gguf(cut, tmp_path / "models")
    _assert_nothing_written(tmp_path / "models")


@pytest.mark.parametrize("content", [b"", b"GG", b"PK\x03\x04" + bytes(100),
                                     b"{\"not\": \"gguf\"}" * 4])
def test_not_a_gguf_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(content)
    with pytest.raises(UnsupportedModel, match="weights.bin is not a GGUF file"):
        import_gguf(path, tmp_path / "models")
    _assert_nothing_written(tmp_path / "models")


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="nowhere.gguf: No such file"):
        import_gguf(tmp_path / "nowhere.gguf", tmp_path / "models")


def test_garbage_header_counts_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "huge.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**60).to_bytes(8, "little") * 2)
    with pytest.raises(CorruptModel, match="huge.gguf is corrupt"):
        read_header(path)


def test_unknown_gguf_version(tmp_path: Path, tiny: tuple) -> None:
    config, tensors = tiny
    path = write_gguf(tmp_path / "v9.gguf", gguf_metadata(config), tensors, version=9)
    with pytest.raises(UnsupportedModel, match="version 9"):
        import_gguf(path, tmp_path / "models")


def test_unknown_tokenizer_model_refused_before_writing(tmp_path: Path, tiny: tuple) -> None:
    config, tensors = tiny
    meta = gguf_metadata(config) | {"tokenizer.ggml.model": "bert"}
    path = write_gguf(tmp_path / "t.gguf", meta, tensors)
    with pytest.raises(UnsupportedModel, match="tokenizer model 'bert'.*'gpt2'.*'llama'"):
        import_gguf(path, tmp_path / "models")
    _assert_nothing_written(tmp_path / "models")


def test_failed_write_leaves_no_folder(tmp_path: Path, tiny: tuple,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    config, tensors = tiny
    path = write_gguf(tmp_path / "ok.gguf", gguf_metadata(config), tensors)
    models = tmp_path / "models"

    def disk_full(folder: Path, *args: object) -> None:
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf_module, "save_weights", disk_full)
    with pytest.raises(ShoalError, match="No space left on device. Free disk space"):
        import_gguf(path, models)
    assert list(models.iterdir()) == []  # no model folder, no hidden temporary one


def test_moe_with_sigmoid_routing_is_refused(tmp_path: Path) -> None:
    config = tiny_config("qwen3_moe")
    tensors, _ = tiny_gguf_tensors(config, tiny_hf_weights(config))
    meta = gguf_metadata(config) | {"qwen3moe.expert_gating_func": 2}
    path = write_gguf(tmp_path / "moe.gguf", meta, tensors)
    with pytest.raises(UnsupportedModel, match="moe.gguf routes experts with gating function 2"):
        import_gguf(path, tmp_path / "models")
    _assert_nothing_written(tmp_path / "models")


def test_deeply_nested_metadata_arrays_are_refused_naming_the_key(tmp_path: Path,
                                                                  tiny: tuple) -> None:
    """10,000 arrays inside each other were a RecursionError that ended the import."""
    config, tensors = tiny
    meta = gguf_metadata(config) | {"general.evil": nested_arrays(10_000)}
    path = write_gguf(tmp_path / "deep.gguf", meta, tensors)
    with pytest.raises(CorruptModel, match=r"^deep.gguf is corrupt: metadata general.evil "
                       f"nests arrays more than {MAX_ARRAY_DEPTH} deep"):
        import_gguf(path, tmp_path / "models")
    _assert_nothing_written(tmp_path / "models")
    r = subprocess.run([sys.executable, "-m", "app.cli", "models", "import", str(path),
                        "--home", str(tmp_path / "home")], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "deep.gguf is corrupt: metadata general.evil nests arrays" in r.stderr


def test_nesting_a_real_file_could_use_is_read(tmp_path: Path, tiny: tuple) -> None:
    config, tensors = tiny
    meta = gguf_metadata(config) | {"general.nested": nested_arrays(MAX_ARRAY_DEPTH)}
    header = read_header(write_gguf(tmp_path / "ok.gguf", meta, tensors))
    value = header.get("general.nested")
    for _ in range(MAX_ARRAY_DEPTH - 1):
        value = value[0]
    assert value == []


@pytest.mark.parametrize("itype,count", [(9, MAX_ARRAY_ITEMS + 1), (9, 2**40),
                                         (7, MAX_ARRAY_ITEMS + 1), (8, 2**62)])
def test_arrays_longer_than_any_real_file_holds_are_refused(tmp_path: Path, tiny: tuple,
                                                           itype: int, count: int) -> None:
    """A count the file's bytes can't hold, or beyond the bound, is refused before the
    reader loops or builds the list (bools take one byte: a big file could hold them)."""
    config, tensors = tiny
    raw = Raw(9, struct.pack("<IQ", itype, count) + bytes(64))
    path = write_gguf(tmp_path / "long.gguf", gguf_metadata(config) | {"general.long": raw},
                      tensors)
    with pytest.raises(CorruptModel, match="long.gguf is .*general.long"):
        read_header(path)
