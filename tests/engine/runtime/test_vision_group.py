"""Images across a group (MLX ring on 127.0.0.1): rank 0 runs the vision tower, its
features enter the sharded language model (a pipeline's first stage; every tensor
parallel rank through an all_sum). One launch per strategy serves several requests: an
image request greedy token for token as in-process mlx-vlm on the same weights, a text
request in the same batch as one process answers it, the same image re-sent hits the
prefix cache past its tokens and another image doesn't."""

from __future__ import annotations

import base64
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_harness import Group, collect_all  # noqa: E402

from engine.errors import BadRequest  # noqa: E402
from engine.protocol import GenerateRequest, SamplingRequest  # noqa: E402
from tiny_vision import image_input, make_tiny_gemma3, make_tiny_mistral3, png  # noqa: E402

ASK = "What is in this picture?"
CASES = {  # family, strategy, pipeline split
    "gemma3-pipeline": (make_tiny_gemma3, "pipeline", [[0, 3], [3, 6]]),
    "mistral3-tensor": (make_tiny_mistral3, "tensor", None),
    "gemma3-tensor": (make_tiny_gemma3, "tensor", None),
    "mistral3-pipeline": (make_tiny_mistral3, "pipeline", [[0, 2], [2, 4]]),
}


def request(images: list[bytes], text: str = ASK, max_tokens: int = 10) -> dict[str, Any]:
    """The worker's generate request (as the node sends it): `images` after the text."""
    parts: list[Any] = [{"type": "text", "text": text}]
    parts += [{"type": "image", "image": i} for i in range(len(images))]
    return {"messages": [{"role": "user", "content": text, "parts": parts}],
            "images": [image_input(b) for b in images],
            "sampling": {"max_tokens": max_tokens, "temperature": 0.0, "logprobs": 0}}


def one_process(folder: Path, req: dict[str, Any], tmp: Path) -> tuple[list[int], list[int]]:
    """(the prompt's ids, greedy tokens) on one process: in-process mlx-vlm for an image
    request, Shoal's own generate for a text one (its ids rendered by Shoal)."""
    from engine.runtime.generate import generate
    from engine.runtime.load import load_model
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.request import prepare
    from engine.runtime.sampling import Sampling
    from engine.runtime.vision.tower import Vision

    model, tokenizer, _ = load_model(folder)
    greq = as_request(req)
    ids, text, _, _, images = prepare(tokenizer, greq, 4096, Vision(folder, model))
    n = req["sampling"]["max_tokens"]
    if images is None:
        sampling = Sampling.of(SamplingRequest(max_tokens=n, temperature=0.0), n, None)
        recs = generate(model, tokenizer, ids, sampling, prefix=PrefixCache(0))
        return ids, [r.token for r in recs]
    from mlx_vlm import load
    from mlx_vlm.generate import generate as vlm_generate

    vlm, processor = load(str(folder))
    paths = []
    for i, im in enumerate(req["images"]):
        paths.append(str(tmp / f"{i}.png"))
        Path(paths[-1]).write_bytes(base64.b64decode(im["data"]))
    out = vlm_generate(vlm, processor, text, image=paths, max_tokens=n, temperature=0.0,
                       verbose=False)
    return ids, list(out.token_ids)


def as_request(req: dict[str, Any]) -> GenerateRequest:
    return GenerateRequest(**{**req, "sampling": SamplingRequest.of(**req["sampling"])})


def tokens(events: list[dict]) -> list[int]:
    return [lp["id"] for e in events if e["ev"] == "delta" for lp in e.get("logprobs") or []]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback")
@pytest.mark.parametrize("case", list(CASES))
def test_images_through_a_group(case: str, tmp_path: Path) -> None:
    make, strategy, layers = CASES[case]
    folder = make(tmp_path / "model")
    first = request([png(40, 30, 1), png(20, 56, 2)])
    text_only = {**request([], "Tell me about ring networks."), "images": []}
    other = request([png(40, 30, 7), png(20, 56, 2)])
    ids, want = one_process(folder, first, tmp_path)
    text_ids, text_want = one_process(folder, text_only, tmp_path)
    _, other_want = one_process(folder, other, tmp_path)
    group = Group(tmp_path / "g", folder, 2, strategy, layers, streams=4)
    try:
        ready = group.ready()
        assert "vision" in ready[0]["capabilities"]
        leader = group.leader
        for rid, req in (("img", first), ("txt", text_only)):  # one batch
            leader.send({"op": "generate", "id": rid, "request": req})
        got = collect_all(leader, ["img", "txt"])
        drafted = {**first, "sampling": {**first["sampling"], "speculative": True}}
        leader.send({"op": "generate", "id": "again", "request": drafted})
        again = collect_all(leader, ["again"])["again"]
        leader.send({"op": "generate", "id": "other", "request": other})
        moved = collect_all(leader, ["other"])["other"]
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()
    done = {k: ev[-1] for k, ev in {**got, "again": again, "other": moved}.items()}
    assert all(d["ev"] == "done" for d in done.values()), done
    assert tokens(got["img"]) == want
    assert done["img"]["prompt_tokens"] == len(ids)  # the images' tokens count
    assert tokens(got["txt"]) == text_want and done["txt"]["prompt_tokens"] == len(text_ids)
    assert tokens(again) == want  # (it asked for drafts: an image request drafts none)
    first_image = _first_image(ids, folder)
    assert done["again"]["cached_tokens"] > first_image  # past the image's tokens
    # another image: no hit past the text before it (none at all where the family's
    # sliding-window caches can't be cut back to it), and its own answer
    assert done["other"]["cached_tokens"] <= first_image
    assert tokens(moved) == other_want


def _first_image(ids: list[int], folder: Path) -> int:
    """The position of the prompt's first image token."""
    import json

    config = json.loads((folder / "config.json").read_text())
    image = config.get("image_token_index") or config.get("image_token_id")
    return ids.index(image)


def test_a_lockstep_group_refuses_images_naming_messages() -> None:
    """One request at a time through a group has no image path: a 400, not a wrong
    answer."""
    from engine.runtime.group.rank import GroupLeader
    from engine.runtime.vision.group import LOCKSTEP

    leader = GroupLeader.__new__(GroupLeader)
    leader.no_images = LOCKSTEP
    req = as_request(request([png(8, 8)]))
    with pytest.raises(BadRequest, match="one request at a time") as e:
        leader.generate("r", req, threading.Event(), lambda m: None)
    assert e.value.param == "messages" and e.value.code == "images_unsupported"


# --- rank 0's scheduler with an image request, beside a follower (no MLX group) -------
class Pictures:
    """An ImagePrompt as the scheduler reads it: keys (image tokens negative) and the
    tower's embeddings from a position on (a failing tower raises)."""

    def __init__(self, keys: list[int], fail: bool = False):
        self.keys, self.fail = keys, fail
        self.asked: list[int] = []

    def embeddings(self, start: int) -> Any:
        import mlx.core as mx

        self.asked.append(start)
        if self.fail:
            raise RuntimeError("the tower failed")
        return mx.ones((len(self.keys) - start, 4)) if min(self.keys[start:]) < 0 else None


def schedule(jobs: list[Any], drafting: Any = None) -> tuple[Any, Any, Any, list[Any]]:
    from test_group_schedule import make_cache, wire

    from engine.runtime.chunking import Chunker
    from engine.runtime.group.lockstep import DTYPES
    from engine.runtime.group.schedule import Scheduler
    from engine.runtime.group.state import State, apply_plan
    from engine.runtime.prefix import PrefixCache

    leader = State(PrefixCache(600, leader=True), make_cache, 1)
    follower = State(PrefixCache(600, leader=False), make_cache, 1)
    sched = Scheduler(leader, streams=4, chunker=Chunker(first=16), hidden=0,
                      dtype=DTYPES[0], sampler=lambda job: None, drafting=drafting)
    sched.waiting += jobs
    plan = sched.step(0)
    apply_plan(wire(plan), follower)
    return sched, leader, follower, [plan]


def job(prompt: list[int], images: Any = None) -> Any:
    from engine.runtime.batching import Job
    from engine.runtime.sampling import Sampling
    return Job(prompt, Sampling(max_tokens=4), None, images=images)


def test_an_image_request_joins_by_its_keys_with_rank_0s_embeddings() -> None:
    """The plan carries the prompt as the prefix cache keys it (the follower never sees
    the image, nor its ids); rank 0 holds the embeddings; both sides agree the chunks run
    from embeddings; a text request beside it runs from ids."""
    ids = [1, 2, 9, 9, 9, 3, 4]
    keys = [1, 2, -11, -12, -13, 3, 4]
    image, text = job(ids, Pictures(keys)), job([1, 2, 5, 6])
    _, leader, follower, (plan,) = schedule([image, text])
    assert plan.admit == [keys, [1, 2, 5, 6]]
    (lead_img, lead_txt), (foll_img, foll_txt) = leader.pending, follower.pending
    assert lead_img.embedded and foll_img.embedded and not lead_txt.embedded
    assert lead_img.embeds.shape == (7, 4) and foll_img.embeds is None
    assert not foll_txt.embedded and lead_txt.embeds is None


def test_a_failing_tower_fails_its_request_only() -> None:
    bad, text = job([1, 9, 2], Pictures([1, -5, 2], fail=True)), job([1, 2, 3])
    _, leader, _, (plan,) = schedule([bad, text])
    assert isinstance(bad.out.get_nowait(), RuntimeError)
    assert plan.admit == [[1, 2, 3]] and len(leader.pending) == 1


def test_a_prompt_ending_in_an_image_is_a_400() -> None:
    """Its last token runs in the decode batch by its id: an image's can't."""
    ending = job([1, 2, 9], Pictures([1, 2, -5]))
    _, leader, _, (plan,) = schedule([ending])
    err = ending.out.get_nowait()
    assert isinstance(err, BadRequest) and err.param == "messages"
    assert plan.admit == [] and not leader.pending


def test_an_image_request_drafts_nothing() -> None:
    """Drafting reads the sequence's tokens, which hold image keys no model takes."""
    import random

    from test_group_schedule import Drafts, compute

    from engine.runtime.group.state import apply_step

    image, text = job([1, 9, 2], Pictures([1, -5, 2])), job([1, 2, 3])
    sched, leader, _, (plan,) = schedule([image, text], Drafts(random.Random(0)))
    while leader.pending:
        compute(plan, leader)
        apply_step(plan, leader)
        plan = sched.step(0)
    for seq in leader.lanes[0].decoding:
        seq.next = 7
    plan = sched.step(0)
    assert plan.guesses > 0
    seqs = leader.lanes[0].decoding
    assert [s.job.images is not None for s in seqs] == [True, False]
    assert seqs[0].guesses == [] and seqs[1].guesses
