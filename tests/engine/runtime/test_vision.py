"""Vision models in the runtime: mlx-lm's language model with mlx-vlm's vision tower in
front answers an image request token for token as in-process mlx-vlm does greedily on the
same weights; the prefix cache keys an image by its hash; an image request batched with a
text request both come out right; bad images are a 400."""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.errors import BadRequest, ContextTooLong
from engine.protocol import Delta, Done, GenerateRequest, SamplingRequest
from tiny_vision import image_input, make_tiny_gemma3, make_tiny_mistral3, png

ASK = "What is in this picture?"


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_gemma3(tmp_path_factory.mktemp("vision") / "gemma3")


@pytest.fixture(scope="module")
def loaded(gemma3: Path) -> tuple[Any, Any, Any]:
    from engine.runtime.load import load_model
    from engine.runtime.vision.tower import Vision

    model, tokenizer, _ = load_model(gemma3)
    return model, tokenizer, Vision(gemma3, model)


def request(images: list[bytes], text: str = ASK, max_tokens: int = 8,
            **kw: Any) -> GenerateRequest:
    parts: list[Any] = [{"type": "text", "text": text}]
    parts += [{"type": "image", "image": i} for i in range(len(images))]
    msg = {"role": "user", "content": text, "parts": parts}
    return GenerateRequest(messages=[msg], images=[image_input(b) for b in images],
                           sampling=SamplingRequest(max_tokens=max_tokens, temperature=0.0),
                           **kw)


def shoal_tokens(loaded: tuple[Any, Any, Any], req: GenerateRequest,
                 prefix: Any = None) -> tuple[list[int], Any, list[Any]]:
    from engine.runtime.generate import generate
    from engine.runtime.request import prepare
    from engine.runtime.sampling import Sampling

    model, tokenizer, vision = loaded
    ids, text, _, _, images = prepare(tokenizer, req, 4096, vision)
    sampling = Sampling.of(req.sampling, req.sampling.max_tokens or 8, None)
    recs = list(generate(model, tokenizer, ids, sampling, prefix=prefix, images=images))
    return [r.token for r in recs], (ids, text, images), recs


def mlx_vlm_tokens(folder: Path, text: str, images: list[bytes], max_tokens: int,
                   tmp: Path) -> tuple[list[int], list[int]]:
    from mlx_vlm import load
    from mlx_vlm.generate import generate
    from mlx_vlm.utils import prepare_inputs

    model, processor = load(str(folder))
    paths = []
    for i, data in enumerate(images):
        (tmp / f"{i}.png").write_bytes(data)
        paths.append(str(tmp / f"{i}.png"))
    from PIL import Image
    ids = prepare_inputs(processor, images=[Image.open(p) for p in paths], prompts=text,
                         image_token_index=_image_token(model.config))["input_ids"]
    out = generate(model, processor, text, image=paths, max_tokens=max_tokens,
                   temperature=0.0, verbose=False)
    return list(out.token_ids), [int(t) for t in ids[0].tolist()]


def _image_token(config: Any) -> int:
    return int(getattr(config, "image_token_index", None) or config.image_token_id)


def test_greedy_matches_mlx_vlm(gemma3: Path, loaded: Any, tmp_path: Path) -> None:
    imgs = [png(40, 30, 1), png(64, 48, 2)]
    req = request(imgs, max_tokens=10)
    ours, (ids, text, images), recs = shoal_tokens(loaded, req)
    theirs, their_ids = mlx_vlm_tokens(gemma3, text, imgs, 10, tmp_path)
    assert ids == their_ids
    assert images.image_tokens == 8  # 4 an image: counted in the prompt's tokens
    assert recs[-1].prompt_tokens == len(ids)
    assert ours == theirs


def test_mistral3_greedy_matches_mlx_vlm(tmp_path: Path) -> None:
    """Pixtral's tower: any aspect ratio, [IMG_BREAK] per row, [IMG_END]; two images of
    different shapes in one turn."""
    from engine.runtime.load import load_model
    from engine.runtime.vision.tower import Vision

    folder = make_tiny_mistral3(tmp_path / "mistral3")
    model, tokenizer, _ = load_model(folder)
    loaded = (model, tokenizer, Vision(folder, model))
    imgs = [png(40, 30, 1), png(20, 56, 2)]
    ours, (ids, text, images), _ = shoal_tokens(loaded, request(imgs, max_tokens=10))
    theirs, their_ids = mlx_vlm_tokens(folder, text, imgs, 10, tmp_path)
    assert ids == their_ids and images.image_tokens > 2
    assert ours == theirs


def test_cache_keys_follow_the_image(loaded: Any) -> None:
    from engine.runtime.prefix import PrefixCache

    prefix = PrefixCache(10_000)
    first, _, _ = shoal_tokens(loaded, request([png(40, 30, 1)]), prefix)
    again, _, recs = shoal_tokens(loaded, request([png(40, 30, 1)]), prefix)
    assert again == first and recs[-1].cached_tokens == recs[-1].prompt_tokens - 1
    other, (ids, _, images), recs = shoal_tokens(loaded, request([png(40, 30, 3)]), prefix)
    # the other image's tokens are keyed apart: the hit stops at its first image token
    assert recs[-1].cached_tokens < images.keys.index(min(images.keys))
    assert other != first
    fresh, _, _ = shoal_tokens(loaded, request([png(40, 30, 3)]))
    assert other == fresh  # a partial hit answers as a cold prompt does


def test_batched_with_text(gemma3: Path, loaded: Any) -> None:
    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.request import run

    model, tokenizer, vision = loaded
    img_req = request([png(40, 30, 1)], max_tokens=12)
    txt_req = GenerateRequest(messages=[{"role": "user", "content": "Say something long."}],
                              sampling=SamplingRequest(max_tokens=12, temperature=0.0))
    alone = {}
    for name, req in (("image", img_req), ("text", txt_req)):
        alone[name] = answer(run, req, model, tokenizer, vision, None)
    batcher = Batcher(model, tokenizer, PrefixCache(10_000), 4)
    got: dict[str, str] = {}
    threads = [threading.Thread(target=lambda n=n, r=r: got.__setitem__(
        n, answer(run, r, model, tokenizer, vision, batcher)))
        for n, r in (("text", txt_req), ("image", img_req))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == alone


def answer(run: Any, req: GenerateRequest, model: Any, tokenizer: Any, vision: Any,
           gen: Any) -> str:
    from functools import partial

    from engine.runtime.generate import generate
    from engine.runtime.prefix import PrefixCache

    out: list[Any] = []
    run("r", req, model, tokenizer, 4096, gen or partial(generate, prefix=PrefixCache(0)),
        threading.Event(), out.append, vision=vision)
    assert isinstance(out[-1], Done)
    return "".join(m.text for m in out if isinstance(m, Delta))


def test_image_tokens_count_in_the_context(loaded: Any) -> None:
    from engine.runtime.request import run

    model, tokenizer, vision = loaded
    req = request([png(40, 30, 1)] * 3)
    counted: list[Any] = []
    run("r", GenerateRequest(**{**req.__dict__, "count_only": True}), model, tokenizer,
        4096, None, threading.Event(), counted.append, vision=vision)  # type: ignore[arg-type]
    n = counted[0].prompt_tokens
    with pytest.raises(ContextTooLong):
        run("r", req, model, tokenizer, n - 1, None, threading.Event(), lambda m: None,
            vision=vision)  # type: ignore[arg-type]


@pytest.mark.parametrize("data", [
    b"not an image at all",
    png(40, 30)[:60],  # truncated
    None,  # a JPEG where a PNG is promised
], ids=["not-an-image", "truncated", "jpeg"])
def test_bad_images_are_a_400(loaded: Any, data: bytes | None) -> None:
    import io

    from PIL import Image

    from engine.runtime.request import prepare

    model, tokenizer, vision = loaded
    req = request([png(40, 30)])
    if data is None:
        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, format="JPEG")
        data = buf.getvalue()
    bad = {**req.images[0], "data": base64.b64encode(data).decode()}  # type: ignore[index]
    with pytest.raises(BadRequest):
        prepare(tokenizer, GenerateRequest(**{**req.__dict__, "images": [bad]}), 4096, vision)


def test_parts_that_point_past_the_images_are_a_400(loaded: Any) -> None:
    from engine.runtime.request import prepare

    _, tokenizer, vision = loaded
    req = request([png(40, 30)])
    msg = {**req.messages[0], "parts": [{"type": "image", "image": 5}]}  # type: ignore[index]
    with pytest.raises(BadRequest, match="image 5"):
        prepare(tokenizer, GenerateRequest(**{**req.__dict__, "messages": [msg]}), 4096,
                vision)


def test_a_text_model_refuses_images(loaded: Any) -> None:
    from engine.runtime.request import prepare

    _, tokenizer, _ = loaded
    with pytest.raises(BadRequest, match="doesn't take images"):
        prepare(tokenizer, request([png(40, 30)]), 4096, None)


def test_image_parts_are_bounded(loaded: Any) -> None:
    from engine.runtime.request import prepare

    _, tokenizer, vision = loaded
    req = request([png(40, 30)])
    msg = {**req.messages[0], "parts": [{"type": "image", "image": 0}] * 17}  # type: ignore[index]
    with pytest.raises(BadRequest, match="At most 16"):
        prepare(tokenizer, GenerateRequest(**{**req.__dict__, "messages": [msg]}), 4096,
                vision)


def test_a_tower_mlx_vlm_cant_load_leaves_the_text_engine(tmp_path: Path) -> None:
    """A vision checkpoint whose tower can't load still serves text (as a text model)."""
    import argparse

    import engine.runtime.vision as vision
    from engine.runtime.text_engine import TextEngine

    folder = make_tiny_gemma3(tmp_path / "g")
    (folder / "preprocessor_config.json").write_text("{not json")
    args = argparse.Namespace(context_limit=None, prefix_cache_tokens=0, draft_model=None,
                              speculative="off", draft_tokens=4, streams=1, kv_bits=None,
                              prefix_disk=None, prefix_disk_bytes=0, memory_limit=None,
                              model=str(folder), model_id="g")
    engine = vision.load_engine(str(folder), args, lambda m: None)
    assert type(engine) is TextEngine and "vision" not in engine.capabilities
    make_tiny_gemma3(folder)  # whole again: it takes images
    assert "vision" in vision.load_engine(str(folder), args, lambda m: None).capabilities


def test_a_group_refuses_images_saying_why() -> None:
    from engine.runtime.vision.group import refuse_images_in_group

    refuse_images_in_group(GenerateRequest(messages=[{"role": "user", "content": "hi"}]))
    with pytest.raises(BadRequest, match="on one node") as e:
        refuse_images_in_group(request([png(8, 8)]))
    assert e.value.code == "images_unsupported"


def test_an_image_without_its_hash_is_a_400(loaded: Any) -> None:
    from engine.runtime.request import prepare

    _, tokenizer, vision = loaded
    req = request([png(40, 30)])
    bad = {**req.images[0], "sha256": "zz"}  # type: ignore[index]
    with pytest.raises(BadRequest, match="sha256"):
        prepare(tokenizer, GenerateRequest(**{**req.__dict__, "images": [bad]}), 4096, vision)


def test_batched_image_prefill_cut_short_is_kept_for_the_retry(loaded: Any) -> None:
    """An image prompt prefills in chunks between the batch's steps; a client that leaves
    mid-prefill leaves its chunks in the prefix cache, and the retry answers as a cold
    request does."""
    from engine.runtime.batching import Batcher
    from engine.runtime.chunking import Chunker
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.request import prepare
    from engine.runtime.sampling import Sampling

    model, tokenizer, vision = loaded
    req = request([png(40, 30, 1), png(30, 40, 2)], text=ASK * 3, max_tokens=6)
    ids, _, _, _, images = prepare(tokenizer, req, 4096, vision)
    sampling = Sampling.of(req.sampling, 6, None)
    batcher = Batcher(model, tokenizer, PrefixCache(10_000), 4,
                      chunker=Chunker(target_s=1e-9, first=16, alone_s=1e-9))
    cancel = threading.Event()

    def heard(cached: int, done: int, total: int) -> None:
        if done > cached:
            cancel.set()  # after the first chunk
    cut = list(batcher(model, tokenizer, ids, sampling, cancel, heard, images=images))
    assert [r.finish_reason for r in cut] == ["cancelled"]
    retry = list(batcher(model, tokenizer, ids, sampling, threading.Event(), images=images))
    assert 0 < retry[-1].cached_tokens < len(ids)
    cold = list(Batcher(model, tokenizer, PrefixCache(0), 4)(
        model, tokenizer, ids, sampling, threading.Event(), images=images))
    assert [r.token for r in retry] == [r.token for r in cold]


def test_a_4bit_conversion_loads_and_answers(gemma3: Path, tmp_path: Path) -> None:
    """mlx-vlm's own 4-bit conversion (as mlx-community ships): the tower loads through
    mlx-vlm's quantization handling, beside mlx-lm's (quantized) language model."""
    from mlx_vlm.convert import convert

    from engine.runtime.load import load_model
    from engine.runtime.vision.tower import Vision

    out = tmp_path / "q4"
    convert(hf_path=str(gemma3), mlx_path=str(out), quantize=True, q_group_size=32, q_bits=4)
    model, tokenizer, _ = load_model(out)
    tokens, (ids, _, images), recs = shoal_tokens((model, tokenizer, Vision(out, model)),
                                                  request([png(40, 30, 1)], max_tokens=4))
    assert len(tokens) == 4 and images.image_tokens == 4
    assert recs[-1].prompt_tokens == len(ids)
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if mx.default_device() == mx.cpu:  # unpacked and widened, as the language model is
        tower = images.vision.model.vision_tower.parameters()
        assert {v.dtype for _, v in tree_flatten(tower)} == {mx.float32}


def test_a_raw_prompt_with_images_is_a_400(loaded: Any) -> None:
    from engine.runtime.request import prepare

    _, tokenizer, vision = loaded
    req = GenerateRequest(prompt="hi", images=[image_input(png(8, 8))])  # type: ignore[list-item]
    with pytest.raises(BadRequest, match="raw prompt"):
        prepare(tokenizer, req, 4096, vision)


def test_folded_turns_keep_their_images_in_order() -> None:
    from engine.runtime.template import fold_turns

    folded = fold_turns([
        {"role": "user", "content": "a"}, {"role": "system", "content": "late"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "b"}]}])
    assert folded == [{"role": "user", "content": [
        {"type": "text", "text": "a\n\nlate\n\n"}, {"type": "image"},
        {"type": "text", "text": "b"}]}]


def test_a_chats_next_turn_hits_the_cache_through_its_image(loaded: Any) -> None:
    from engine.runtime.prefix import PrefixCache

    prefix = PrefixCache(10_000)
    first = request([png(40, 30, 1)], max_tokens=5)
    tokens, (ids, _, images), _ = shoal_tokens(loaded, first, prefix)
    said = loaded[1].decode(tokens)
    turns = [*(first.messages or []), {"role": "assistant", "content": said},
             {"role": "user", "content": "And the colours?"}]
    _, (ids2, _, images2), recs = shoal_tokens(
        loaded, GenerateRequest(**{**first.__dict__, "messages": turns}), prefix)
    last_image = max(i for i, k in enumerate(images2.keys) if k < 0)
    assert recs[-1].cached_tokens > last_image
