"""Qwen2.5-VL, Qwen3-VL and Qwen3.5 images on one node: mlx-lm's language model, with the 3-D
positions mlx-vlm gives an image request's tokens (engine/runtime/vision/positions.py),
answers token for token as in-process mlx-vlm does greedily on the same weights: one
request alone, several images, an image in a later turn, chunked, and batched beside a
text request; a text request answers exactly as without the tower."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from engine.protocol import GenerateRequest, SamplingRequest
from tiny_vision import (
    image_input,
    make_tiny_qwen3vl,
    make_tiny_qwen25vl,
    make_tiny_qwen35,
    png,
)

ASK = "What is in this picture?"
BUILDERS = {"qwen2.5-vl": make_tiny_qwen25vl, "qwen3-vl": make_tiny_qwen3vl,
            "qwen3.5": make_tiny_qwen35}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[Path, Any, Any, Any]:
    """(folder, model, tokenizer, vision) of one family's tiny checkpoint."""
    from engine.runtime.load import load_model
    from engine.runtime.vision.tower import Vision

    folder = BUILDERS[request.param](tmp_path_factory.mktemp("qwen") / request.param)
    model, tokenizer, _ = load_model(folder)
    return folder, model, tokenizer, Vision(folder, model)


def turns(*images: list[bytes], text: str = ASK) -> list[dict[str, Any]]:
    """User turns, the k-th holding images[k] after its text, with a fixed answer between."""
    out: list[dict[str, Any]] = []
    n = 0
    for k, group in enumerate(images):
        if k:
            out.append({"role": "assistant", "content": "A picture."})
        parts: list[Any] = [{"type": "text", "text": f"{text} ({k})"}]
        parts += [{"type": "image", "image": n + i} for i in range(len(group))]
        n += len(group)
        out.append({"role": "user", "content": text, "parts": parts})
    return out


def request(*images: list[bytes], max_tokens: int = 10) -> GenerateRequest:
    return GenerateRequest(messages=turns(*images),  # type: ignore[arg-type]
                           images=[image_input(b) for g in images for b in g],  # type: ignore[misc]
                           sampling=SamplingRequest(max_tokens=max_tokens, temperature=0.0))


def text_request(max_tokens: int = 10) -> GenerateRequest:
    return GenerateRequest(messages=[{"role": "user", "content": "Say something long."}],
                           sampling=SamplingRequest(max_tokens=max_tokens, temperature=0.0))


def prepared(family: Any, req: GenerateRequest) -> tuple[list[int], str, Any, Any]:
    from engine.runtime.request import prepare
    from engine.runtime.sampling import Sampling

    _, _, tokenizer, vision = family
    ids, text, _, _, images = prepare(tokenizer, req, 4096, vision)
    return ids, text, images, Sampling.of(req.sampling, req.sampling.max_tokens or 10, None)


def alone(family: Any, req: GenerateRequest, prefix: Any = None) -> list[int]:
    from engine.runtime.generate import generate

    _, model, tokenizer, _ = family
    ids, _, images, sampling = prepared(family, req)
    return [r.token for r in generate(model, tokenizer, ids, sampling, prefix=prefix,
                                      images=images)]


def mlx_vlm(family: Any, req: GenerateRequest, tmp: Path) -> list[int]:
    """mlx-vlm's own load and greedy generate on the prompt Shoal renders."""
    from mlx_vlm import load
    from mlx_vlm.generate import generate

    folder = family[0]
    _, text, _, _ = prepared(family, req)
    model, processor = load(str(folder))
    paths = []
    for i, im in enumerate(req.images or []):
        import base64
        (tmp / f"{i}.png").write_bytes(base64.b64decode(im["data"]))
        paths.append(str(tmp / f"{i}.png"))
    out = generate(model, processor, text, image=paths,
                   max_tokens=req.sampling.max_tokens, temperature=0.0, verbose=False)
    return list(out.token_ids)


@pytest.mark.parametrize("images", [
    [[png(40, 30, 1)]],
    [[png(40, 30, 1), png(64, 48, 2)]],  # two images of different grids in one turn
    [[], [png(90, 60, 3)]],  # the image in the second turn, after an answer
], ids=["one", "two", "second-turn"])
def test_greedy_matches_mlx_vlm(family: Any, images: list[list[bytes]],
                                tmp_path: Path) -> None:
    req = request(*images)
    _, _, prompt, _ = prepared(family, req)
    assert prompt.placed is not None and prompt.placed.delta < 0  # fewer positions
    assert alone(family, req) == mlx_vlm(family, req, tmp_path)


def test_the_positions_are_what_make_it_match(family: Any) -> None:
    """Without the 3-D positions (mlx-lm's rope at the cache offset) the answer's
    log-probabilities differ: the comparison above can fail."""
    from engine.runtime.generate import generate

    _, model, tokenizer, vision = family
    req = request([png(40, 30, 1), png(64, 48, 2)])
    ids, _, images, sampling = prepared(family, req)
    sampling = sampling.__class__(**{**sampling.__dict__, "logprobs": 0})

    def logprobs() -> list[float]:
        return [r.logprob for r in generate(model, tokenizer, ids, sampling, images=images)]
    right = logprobs()
    images.placed = None
    assert logprobs() != right


def test_deepstack_reaches_the_language_model(tmp_path: Path) -> None:
    """Qwen3-VL's deepstack features change the answer (they enter the first layers)."""
    from engine.runtime.load import load_model
    from engine.runtime.vision.tower import Vision

    folder = make_tiny_qwen3vl(tmp_path / "q3")
    model, tokenizer, _ = load_model(folder)
    fam = (folder, model, tokenizer, Vision(folder, model))
    req = request([png(40, 30, 1)])
    right = alone(fam, req)
    features = fam[3].features
    fam[3].features = lambda ids, inputs: (features(ids, inputs)[0], None)  # type: ignore[method-assign]
    assert alone(fam, req) != right


def test_a_text_request_is_unchanged(family: Any) -> None:
    """The same weights loaded without the tower answer a text request identically,
    alone and batched."""
    from engine.runtime.batching import Batcher
    from engine.runtime.generate import generate
    from engine.runtime.load import load_model
    from engine.runtime.prefix import PrefixCache

    folder, model, tokenizer, _ = family
    plain, _, _ = load_model(folder)
    ids, _, _, sampling = prepared(family, text_request(12))
    want = [r.token for r in generate(plain, tokenizer, ids, sampling)]
    assert [r.token for r in generate(model, tokenizer, ids, sampling)] == want
    batcher = Batcher(model, tokenizer, PrefixCache(0), 4)
    assert [r.token for r in batcher(model, tokenizer, ids, sampling,
                                     threading.Event())] == want


def test_batched_beside_a_text_request(family: Any, tmp_path: Path) -> None:
    """An image request joins a batch where a text request is decoding: both answer as
    they do alone, the image one as mlx-vlm does; its prefill runs in small chunks (the
    image's tokens cut across them)."""
    from engine.runtime.batching import Batcher
    from engine.runtime.chunking import Chunker
    from engine.runtime.prefix import PrefixCache

    _, model, tokenizer, _ = family
    img_req = request([png(40, 30, 1), png(64, 48, 2)], max_tokens=10)
    txt = prepared(family, text_request(40))
    img = prepared(family, img_req)
    want_img = mlx_vlm(family, img_req, tmp_path)
    want_txt = alone(family, text_request(40))
    batcher = Batcher(model, tokenizer, PrefixCache(10_000), 4,
                      chunker=Chunker(target_s=1e-9, first=16, alone_s=1e-9))
    got: dict[str, list[int]] = {}
    decoding = threading.Event()

    def run_text() -> None:
        out = []
        for r in batcher(model, tokenizer, txt[0], txt[3], threading.Event()):
            out.append(r.token)
            decoding.set()
        got["text"] = out

    def run_image() -> None:
        decoding.wait(60)
        got["image"] = [r.token for r in batcher(model, tokenizer, img[0], img[3],
                                                 threading.Event(), images=img[2])]
    threads = [threading.Thread(target=run_text), threading.Thread(target=run_image)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == {"text": want_txt, "image": want_img}


def test_a_chats_next_turn_from_the_cache_answers_as_cold(family: Any, tmp_path: Path
                                                          ) -> None:
    """The next turn re-sends the image: the prefix cache holds its first turn (the
    image's keys rotated at their 3-D positions) and the answer is mlx-vlm's."""
    from engine.runtime.prefix import PrefixCache

    prefix = PrefixCache(10_000)
    first = request([png(40, 30, 1)])
    alone(family, first, prefix)
    nxt = request([png(40, 30, 1)], [])
    from engine.runtime.generate import generate

    _, model, tokenizer, _ = family
    ids, _, images, sampling = prepared(family, nxt)
    recs = list(generate(model, tokenizer, ids, sampling, prefix=prefix, images=images))
    assert recs[-1].cached_tokens > images.placed.plain_from  # past the image
    assert [r.token for r in recs] == mlx_vlm(family, nxt, tmp_path)


def test_rows_join_the_batch_at_offset_plus_delta() -> None:
    """mlx-lm merges the joining requests' caches with the first one's class: whichever
    comes first, the image request's row rotates at its offset + delta and the text
    request's at its offset."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from engine.runtime.vision.positions import MARK, Placed, joining

    class Model:
        pass
    model = Model()
    object.__setattr__(model, MARK, object())

    def cache(n: int) -> list[Any]:
        c = KVCache()
        c.update_and_fetch(mx.zeros((1, 2, n, 4)), mx.zeros((1, 2, n, 4)))
        return [c]

    class Images:
        placed = Placed.of(__import__("numpy").zeros((3, 1), dtype=int), -7)
    text, image = joining(model, cache(5), None), joining(model, cache(9), Images())
    for order, want in (((text, image), [5, 2]), ((image, text), [2, 5])):
        merged = order[0][0].merge([c[0] for c in order])
        assert merged.offset.tolist() == want
    assert joining(Model(), cache(3), Images())[0].offset == 3  # other families: as is


def test_a_quantized_kv_batch_places_images_too(family: Any) -> None:
    """With 8-bit KV (--kv-bits 8) an image request batched answers as it does alone with
    that cache."""
    from engine.runtime.batching import Batcher
    from engine.runtime.generate import generate
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.quant_kv import KV

    folder, model, tokenizer, _ = family
    if folder.name == "qwen2.5-vl":
        pytest.skip("its tiny heads (16 wide) are too narrow for quantized KV")
    ids, _, images, sampling = prepared(family, request([png(40, 30, 1), png(64, 48, 2)]))
    want = [r.token for r in generate(model, tokenizer, ids, sampling,
                                      kv=KV.for_model(model, 8), images=images)]
    batcher = Batcher(model, tokenizer, PrefixCache(0), 4, kv_bits=8)
    assert [r.token for r in batcher(model, tokenizer, ids, sampling, threading.Event(),
                                     images=images)] == want


def test_an_unfinished_image_stream_leaves_other_threads_alone(family: Any) -> None:
    """An image request's stream paused mid-answer (its client is slow) holds its
    positions on its own thread only: a text request on another thread answers as
    always."""
    from engine.runtime.generate import generate

    _, model, tokenizer, _ = family
    ids, _, _, sampling = prepared(family, text_request(12))
    want = [r.token for r in generate(model, tokenizer, ids, sampling)]
    img_ids, _, images, img_sampling = prepared(family, request([png(40, 30, 1)]))
    paused = generate(model, tokenizer, img_ids, img_sampling, images=images)
    next(paused)  # mid-answer, its positions set
    got: list[int] = []
    t = threading.Thread(target=lambda: got.extend(
        r.token for r in generate(model, tokenizer, ids, sampling)))
    t.start()
    t.join(60)
    paused.close()
    assert got == want
