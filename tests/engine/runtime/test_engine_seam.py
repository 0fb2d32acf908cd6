"""The worker's seam (engine/runtime/engine.py, factory.py): the factory picks the engine a
model folder needs, and a worker serving a text model answers what it can't serve (images,
embeddings, rerank) with a 400 that says so, then keeps serving."""

from __future__ import annotations

import json
import sys
import types
from argparse import Namespace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_harness import Worker, collect  # noqa: E402

from tiny import LLAMA, make_tiny_model  # noqa: E402

HELLO = [{"role": "user", "content": "Hello"}]
PIXEL = {"data": "iVBORw0KGgo=", "sha256": "0" * 64, "width": 1, "height": 1}


def _folder(tmp: Path, config: dict, *files: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config))
    for f in files:
        (tmp / f).write_text("{}")
    return tmp


@pytest.fixture
def loaders(monkeypatch):
    """Each loader the factory may call, recording which one ran."""
    called: list[str] = []

    def loader(name: str, fail: type[Exception] | None = None):
        def load(model_dir, args, emit):
            called.append(name)
            if fail is not None:
                raise fail("not here")
            return name
        return load

    import engine.runtime.group.rank as rank
    import engine.runtime.text_engine as text
    monkeypatch.setattr(text, "load_text_engine", loader("text"))
    monkeypatch.setattr(rank, "load_rank", loader("rank"))
    for pkg in ("embedding", "vision"):
        mod = types.ModuleType(f"engine.runtime.{pkg}")
        mod.load_engine = loader(pkg)  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, f"engine.runtime.{pkg}", mod)
    return called, loader


def test_the_factory_picks_the_engine_by_what_the_checkpoint_does(tmp_path, loaders):
    from engine.runtime.factory import make_engine

    called, _ = loaders
    alone = Namespace(dist=None)
    cases = {
        "text": _folder(tmp_path / "llama", {"model_type": "llama"}),
        "embedding": _folder(tmp_path / "st", {"model_type": "bert"}, "modules.json"),
        "vision": _folder(tmp_path / "gemma", {"model_type": "gemma3",
                                               "vision_config": {"hidden_size": 8}}),
    }
    for want, folder in cases.items():
        assert make_engine(str(folder), alone, print) == want
    # a folder that can't be read is left to the text loader, which says what is wrong
    assert make_engine(str(tmp_path / "missing"), alone, print) == "text"
    # a group's rank goes through the group's path whatever the folder holds
    assert make_engine(str(cases["embedding"]), Namespace(dist=tmp_path / "d.json"),
                       print) == "rank"
    assert called == ["text", "embedding", "vision", "text", "rank"]


@pytest.mark.parametrize("failure", [ImportError, NotImplementedError])
def test_a_vision_model_is_served_as_text_while_its_engine_cant_run(tmp_path, loaders,
                                                                    monkeypatch, failure,
                                                                    caplog):
    from engine.runtime.factory import make_engine

    called, loader = loaders
    monkeypatch.setattr(sys.modules["engine.runtime.vision"], "load_engine",
                        loader("vision", failure))
    folder = _folder(tmp_path, {"model_type": "mistral3", "vision_config": {}})
    assert make_engine(str(folder), Namespace(dist=None), print) == "text"
    assert called == ["vision", "text"]
    assert "as text only" in caplog.text


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("seam") / "tiny", LLAMA)


@pytest.mark.parametrize("streams", [1, 4])
def test_a_text_worker_refuses_images_embeddings_and_rerank_and_keeps_serving(
        tmp_path, model, streams):
    w = Worker(["--model", str(model), "--model-id", "m", "--streams", str(streams)],
               tmp_path / "w.log")
    try:
        ready = w.expect(lambda e: e["ev"] == "ready", 120)
        assert ready["capabilities"] == ["generate"]
        parts = [{"role": "user", "content": "What is this?",
                  "parts": [{"type": "image", "image": 0},
                            {"type": "text", "text": "What is this?"}]}]
        for rid, request in (("img", {"messages": parts, "images": [PIXEL]}),
                             ("parts", {"messages": parts})):
            w.send({"op": "generate", "id": rid, "request": request})
            [err] = collect(w, rid)
            assert (err["ev"], err["status"], err["code"], err["param"]) == \
                ("error", 400, "images_unsupported", "messages")
            assert "doesn't take images" in err["message"]
        w.send({"op": "embed", "id": "e", "inputs": ["a text", [1, 2, 3]]})
        w.send({"op": "cancel", "id": "e"})  # a cancel for it, or after it, is harmless
        w.send({"op": "rerank", "id": "r", "query": "q", "documents": ["a", "b"]})
        for rid, what in (("e", "embed"), ("r", "rerank")):
            [err] = collect(w, rid)
            assert (err["status"], err["param"]) == (400, "model")
            assert f"can't {what}" in err["message"] and "generate" in err["message"]
        w.send({"op": "generate", "id": "ok",
                "request": {"messages": HELLO, "sampling": {"max_tokens": 3}}})
        assert collect(w, "ok")[-1]["ev"] == "done"
        w.send({"op": "shutdown"})
        assert w.proc.wait(30) == 0  # it leaves when told, cleanly (stdin still open)
    finally:
        w.kill()
