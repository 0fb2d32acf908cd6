"""Qwen-VL models beyond the engine: a real node answers an image through the OpenAI SDK
as mlx-vlm does, a group refuses their images with a 400 saying why (a real two-rank
pipeline answers text beside it), and the bundle keeps what they load."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_vision_qwen import (  # noqa: E402
    ASK,
    BUILDERS,
    mlx_vlm,
    prepared,
    request,
    text_request,
    turns,
)

from engine.protocol import GenerateRequest  # noqa: E402
from tiny_vision import image_input, make_tiny_qwen3vl, make_tiny_qwen25vl, png  # noqa: E402


def test_the_bundle_keeps_what_the_qwen_families_load(tmp_path: Path) -> None:
    """Every mlx-vlm and transformers model module loading these families imports (in a
    fresh process) is one the bundle's trim keeps."""
    import json
    import os
    import subprocess

    import mlx_vlm
    import transformers

    root = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "packaging"))
    try:
        from shoalpack.trim import transformers_excludes, vlm_keep
    finally:
        sys.path.remove(str(root / "packaging"))
    from engine.modelconfig import VISION_FAMILIES

    folders = [str(make(tmp_path / name)) for name, make in BUILDERS.items()]
    script = (
        "import json, sys\nfrom pathlib import Path\n"
        "from engine.runtime.load import load_model\n"
        "from engine.runtime.vision.tower import Vision\n"
        "for f in sys.argv[1:]:\n    m, _, _ = load_model(Path(f)); Vision(Path(f), m)\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.startswith("
        "('mlx_vlm.models.', 'transformers.models.')))))\n")
    out = subprocess.run([sys.executable, "-c", script, *folders], capture_output=True,
                         text=True, timeout=300, cwd=root,
                         env={**os.environ, "PYTHONPATH": f"{root}:{root / 'tests'}"})
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    keep = vlm_keep(VISION_FAMILIES, Path(mlx_vlm.__file__).parent / "models")
    dropped = set(transformers_excludes(Path(transformers.__file__).parent, VISION_FAMILIES))
    assert [n for n in loaded if n.startswith("mlx_vlm.") and not keep(n)] == []
    assert [n for n in loaded if n in dropped] == []


def test_a_group_refuses_qwen_images_saying_why(tmp_path: Path) -> None:
    """A Qwen-VL model split over a group takes text only: rank 0 loads no tower, and an
    image request is a 400 that says images need one node (gemma3 is unaffected)."""
    from engine.errors import BadRequest
    from engine.runtime.group.rank import GroupLeader
    from engine.runtime.vision.group import M_ROPE, group_refusal, load_group_vision
    from tiny_vision import make_tiny_gemma3

    qwen = make_tiny_qwen25vl(tmp_path / "q")
    assert group_refusal(qwen) == M_ROPE and load_group_vision(qwen, None) is None
    assert group_refusal(make_tiny_gemma3(tmp_path / "g")) is None
    leader = GroupLeader.__new__(GroupLeader)
    leader.no_images = M_ROPE
    with pytest.raises(BadRequest, match="one node only") as e:
        leader.generate("r", request([png(8, 8)]), threading.Event(), lambda m: None)
    assert e.value.code == "images_unsupported"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback")
def test_a_qwen_pipeline_group_answers_text_and_refuses_images(tmp_path: Path) -> None:
    """Two ranks on 127.0.0.1, batching: Ready doesn't list vision, an image request gets
    the 400, a text request beside it answers as one process does."""
    from dist_harness import Group, collect_all

    from engine.runtime.generate import generate
    from engine.runtime.load import load_model
    from engine.runtime.request import prepare

    folder = make_tiny_qwen25vl(tmp_path / "model")
    model, tokenizer, _ = load_model(folder)
    txt = text_request(10)
    ids, _, _, _, _ = prepare(tokenizer, txt, 4096, None)
    sampling = prepared((folder, model, tokenizer, None), txt)[3]
    want = [r.token for r in generate(model, tokenizer, ids, sampling)]
    img = {"messages": turns([png(40, 30, 1)]), "images": [image_input(png(40, 30, 1))],
           "sampling": {"max_tokens": 10, "temperature": 0.0}}
    group = Group(tmp_path / "g", folder, 2, "pipeline", [[0, 2], [2, 4]], streams=4)
    try:
        ready = group.ready()
        assert "vision" not in ready[0]["capabilities"]
        leader = group.leader
        leader.send({"op": "generate", "id": "img", "request": img})
        leader.send({"op": "generate", "id": "txt", "request": {
            "messages": txt.messages, "sampling": {"max_tokens": 10, "temperature": 0.0,
                                                   "logprobs": 0}}})
        got = collect_all(leader, ["img", "txt"])
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()
    refused = got["img"][-1]
    assert refused["ev"] == "error" and refused["status"] == 400, refused
    assert "one node only" in refused["message"]
    assert [lp["id"] for e in got["txt"] if e["ev"] == "delta"
            for lp in e.get("logprobs") or []] == want


def test_a_node_serves_qwen_images_through_the_sdk(tmp_path: Path, tiny_model_dir: Path
                                                   ) -> None:
    """A real node serving a tiny Qwen3-VL: an image through the OpenAI SDK is answered as
    in-process mlx-vlm answers it, with a text request to the same model at once."""
    import base64

    import openai

    from nodes import NodeProcess, home_with

    home = home_with(tmp_path / "home", tiny_model_dir)
    folder = make_tiny_qwen3vl(home / "models" / "tiny-qwen3-vl")
    image = png(40, 30, 5)
    req = request([image], max_tokens=8)
    req = GenerateRequest(**{**req.__dict__, "messages": [{
        "role": "user", "content": ASK, "parts": [{"type": "text", "text": ASK},
                                                  {"type": "image", "image": 0}]}]})
    from engine.runtime.load import load_model
    from engine.runtime.vision.tower import Vision

    model, tokenizer, _ = load_model(folder)
    fam = (folder, model, tokenizer, Vision(folder, model))
    want = tokenizer.decode(mlx_vlm(fam, req, tmp_path))
    node = NodeProcess(home, "tiny-qwen3-vl").wait_healthy()
    try:
        node.wait_ready()
        oa = openai.OpenAI(base_url=node.url + "/v1", api_key="k", max_retries=0,
                           timeout=120)
        data = base64.b64encode(image).decode()
        got: dict[str, Any] = {}

        def ask_text() -> None:
            got["text"] = oa.chat.completions.create(
                model="tiny-qwen3-vl", max_tokens=30, temperature=0,
                messages=[{"role": "user", "content": "Say something long."}])
        t = threading.Thread(target=ask_text)
        t.start()
        reply = oa.chat.completions.create(model="tiny-qwen3-vl", max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": [
                                               {"type": "text", "text": ASK},
                                               {"type": "image_url", "image_url": {
                                                   "url": f"data:image/png;base64,{data}"}}]}])
        t.join(120)
    finally:
        node.stop()
    assert reply.choices[0].message.content == want
    assert got["text"].choices[0].finish_reason == "length"
