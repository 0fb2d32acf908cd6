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
    request,
)

from engine.protocol import GenerateRequest  # noqa: E402
from tiny_vision import make_tiny_qwen3vl, png  # noqa: E402


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


def test_deepstack_layers_off_a_pipelines_first_node_refuse_images_saying_how() -> None:
    """Qwen3-VL's deepstack features enter its first 3 layers, which rank 0 adds: a
    pipeline whose first node holds 2 answers images with a 400 that says how to place
    it; one holding 3, a tensor group (every rank holds every layer) and a family without
    deepstack take them. (Served for real: test_vision_qwen_group.py.)"""
    from types import SimpleNamespace

    from engine.errors import BadRequest
    from engine.runtime.group.rank import GroupLeader
    from engine.runtime.vision.group import group_refusal
    from engine.runtime.vision.positions import MARK, Placing

    placing = Placing()
    placing.deep = 3
    lm = SimpleNamespace(**{MARK: placing})
    assert group_refusal(lm, 3) is None and group_refusal(lm, None) is None
    assert group_refusal(SimpleNamespace(), 1) is None
    leader = GroupLeader.__new__(GroupLeader)
    leader.no_images = group_refusal(lm, 2)
    with pytest.raises(BadRequest, match="at least 3 layers on its first node") as e:
        leader.generate("r", request([png(8, 8)]), threading.Event(), lambda m: None)
    assert e.value.code == "images_unsupported" and e.value.param == "messages"


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
