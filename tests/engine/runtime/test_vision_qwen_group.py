"""Qwen-VL images across a group (MLX ring on 127.0.0.1): every rank's attention rotates
an image request's tokens at the 3-D positions the plan carries, and later ones at
offset + delta; Qwen3-VL's deepstack features reach its first layers (a pipeline's rank 0
holds them; tensor ranks get rank 0's). Greedy token for token as in-process mlx-vlm: an
image request beside a text request, the same one again from the prefix cache, another
image alone. A pipeline whose first stage lacks the deepstack layers answers images with
a clear 400 and text as ever."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_harness import Group, collect_all  # noqa: E402
from test_vision_group import as_request, one_process, request, tokens  # noqa: E402

from tiny_vision import make_tiny_qwen3vl, make_tiny_qwen25vl, make_tiny_qwen35, png  # noqa: E402


def _dense(folder: Path) -> Path:
    return make_tiny_qwen3vl(folder, dense=True)


CASES = {  # family, strategy, pipeline split (4 layers; Qwen3-VL's deepstack takes 3)
    "qwen2.5-vl-pipeline": (make_tiny_qwen25vl, "pipeline", [[0, 2], [2, 4]]),
    "qwen2.5-vl-pipeline-2-lanes": (make_tiny_qwen25vl, "pipeline", [[0, 1], [1, 4]]),
    "qwen3-vl-pipeline": (_dense, "pipeline", [[0, 3], [3, 4]]),
    # (MoE: mlx-lm's qwen3_vl_moe sanitize wants lm_head, which only rank 0 holds)
    "qwen3-vl-moe-pipeline": (make_tiny_qwen3vl, "pipeline", [[0, 3], [3, 4]]),
    "qwen2.5-vl-tensor": (make_tiny_qwen25vl, "tensor", None),
    "qwen3-vl-tensor": (make_tiny_qwen3vl, "tensor", None),  # (MoE)
    "qwen3-vl-dense-tensor": (_dense, "tensor", None),
    "qwen3.5-pipeline": (make_tiny_qwen35, "pipeline", [[0, 2], [2, 4]]),
    "qwen3.5-tensor": (make_tiny_qwen35, "tensor", None),
}


def logprobs_alone(folder: Path, req: dict[str, Any]) -> list[float]:
    """Shoal's own answer on one process (its positions checked against mlx-vlm by
    test_vision_qwen.py): the chosen tokens' log-probabilities, which the positions move
    even where greedy tokens don't."""
    from dataclasses import replace

    from engine.runtime.generate import generate
    from engine.runtime.load import load_model
    from engine.runtime.request import prepare
    from engine.runtime.sampling import Sampling
    from engine.runtime.vision.tower import Vision

    model, tokenizer, _ = load_model(folder)
    greq = as_request(req)
    ids, _, _, _, images = prepare(tokenizer, greq, 4096, Vision(folder, model))
    n = req["sampling"]["max_tokens"]
    sampling = replace(Sampling.of(greq.sampling, n, None), logprobs=0)
    return [r.logprob for r in generate(model, tokenizer, ids, sampling, images=images)]


def logprobs(events: list[dict]) -> list[float]:
    return [lp["logprob"] for e in events if e["ev"] == "delta"
            for lp in e.get("logprobs") or []]


def _text() -> dict[str, Any]:
    return {**request([], "Tell me about ring networks."), "images": []}


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback")
@pytest.mark.parametrize("case", list(CASES))
def test_qwen_images_through_a_group(case: str, tmp_path: Path) -> None:
    make, strategy, layers = CASES[case]
    folder = make(tmp_path / "model")
    first = request([png(40, 30, 1), png(64, 48, 2)])
    other = request([png(90, 60, 3)])
    ids, want = one_process(folder, first, tmp_path)
    text_ids, text_want = one_process(folder, _text(), tmp_path)
    _, other_want = one_process(folder, other, tmp_path)
    want_lp = logprobs_alone(folder, first)
    lanes = 2 if case.endswith("2-lanes") else 1  # the image and text decode apart
    group = Group(tmp_path / "g", folder, 2, strategy, layers, streams=4, lanes=lanes)
    try:
        assert "vision" in group.ready()[0]["capabilities"]
        leader = group.leader
        for rid, req in (("img", first), ("txt", _text())):  # one batch
            leader.send({"op": "generate", "id": rid, "request": req})
        got = collect_all(leader, ["img", "txt"])
        leader.send({"op": "generate", "id": "again", "request": first})
        again = collect_all(leader, ["again"])["again"]
        leader.send({"op": "generate", "id": "other", "request": other})
        alone = collect_all(leader, ["other"])["other"]
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()
    done = {k: ev[-1] for k, ev in {**got, "again": again, "other": alone}.items()}
    assert all(d["ev"] == "done" for d in done.values()), done
    assert want and tokens(got["img"]) == want
    assert logprobs(got["img"]) == pytest.approx(want_lp, abs=2e-3)
    assert done["img"]["prompt_tokens"] == len(ids)
    assert tokens(got["txt"]) == text_want and done["txt"]["prompt_tokens"] == len(text_ids)
    assert done["again"]["cached_tokens"] > len(ids) // 2  # past the images' tokens
    assert tokens(again) == want  # its rows join at offset + delta from the cache too
    assert tokens(alone) == other_want


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback")
def test_deepstack_layers_off_the_first_stage_refuse_images(tmp_path: Path) -> None:
    """Qwen3-VL's first 3 layers take deepstack features; rank 0 holding 2 of them can't
    add them: images get a 400 that says how to place it, text is served."""
    folder = _dense(tmp_path / "model")
    _, text_want = one_process(folder, _text(), tmp_path)
    group = Group(tmp_path / "g", folder, 2, "pipeline", [[0, 2], [2, 4]], streams=4)
    try:
        group.ready()
        leader = group.leader
        leader.send({"op": "generate", "id": "img", "request": request([png(40, 30, 1)])})
        leader.send({"op": "generate", "id": "txt", "request": _text()})
        got = collect_all(leader, ["img", "txt"])
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()
    refused = got["img"][-1]
    assert refused["ev"] == "error" and refused["code"] == "images_unsupported", refused
    assert "first 3 layers" in refused["message"]
    assert tokens(got["txt"]) == text_want


def test_a_plan_carries_each_image_prompts_positions_to_the_followers() -> None:
    """The codec: an image prompt's delta and 3-D rows arrive as rank 0 sent them (a text
    prompt beside it has none); a follower's Placed places the same tokens; rows that
    don't fit the prompt put the follower out of step instead of misplacing it."""
    import numpy as np
    from test_group_schedule import make_cache, wire

    from engine.runtime.group.state import OutOfStep, Plan, State, apply_plan
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.vision.positions import Placed

    rows = np.array([[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5],
                     [0, 1, 2, 3, 2, 3, 4, 5]])
    placed = Placed.of(rows, -2)
    image, text = [1, 2, -7, -8, -9, -10, 3, 4], [1, 5, 6]
    plan = Plan(admit=[image, text], cached=[0, 0], places=[placed.wire(), []])
    got = wire(plan)
    assert got.places == [placed.wire(), []] and got.admit == [image, text]
    follower = State(PrefixCache(0, leader=False), make_cache, 1)
    seq_img, seq_txt = apply_plan(got, follower)
    assert seq_txt.placed is None and seq_img.placed.delta == -2
    assert seq_img.placed.plain_from == placed.plain_from == 6
    assert (np.array(seq_img.placed.chunk(0, 10)) == np.array(placed.chunk(0, 10))).all()
    bad = Plan(admit=[image[:5]], cached=[0], places=[placed.wire()])
    with pytest.raises(OutOfStep, match="positions for 8 tokens"):
        apply_plan(wire(bad), State(PrefixCache(0, leader=False), make_cache, 1))
