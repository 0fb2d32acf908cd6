"""The KV of a prompt made on one node and used on another (engine/runtime/handover.py),
in one process: the prefill side's frames, read back on the decode side, decode the same
greedy tokens as a prefill of its own, for a dense model, an MLA model (DeepSeek V3's
latent KV), sliding-window families (Gemma 3, Ministral 3, gpt-oss), a recurrent one
(Qwen3-Next's linear attention) and 8-bit quantized KV, with a prompt longer than a chunk.
The frames go out as each layer makes them, and the decode side reads a file still being
written. Frames that aren't this model's cache for those
tokens are refused with a 400, never kept."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from engine.errors import BadRequest
from engine.runtime.handover import Cancelled, adopt_stream, layout_of, prefill_stream, tail
from engine.runtime.kv_frames import Reader, encode
from engine.runtime.load import load_model
from engine.runtime.quant_kv import KV
from families import make_family_model
from tiny import make_tiny_model

CHUNK = 48  # the prefill's chunk: the prompts below are longer than three of them
END = encode({"kind": "end", "seconds": 0.0})


def greedy(model, cache, last: int, n: int = 12) -> list[int]:
    import mlx.core as mx
    out, tok = [], last
    for _ in range(n):
        logits = model(mx.array([[tok]]), cache=cache)
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
    return out


def frames_of(model, kv, tokens, made_by="m") -> bytes:
    out = io.BytesIO()
    prefill_stream(model, kv, tokens, out, threading.Event(), chunk=CHUNK, made_by=made_by)
    return out.getvalue() + END


def adopt(model, kv, tokens, data: bytes, made_by="m", layout=None):
    return adopt_stream(model, kv, tokens, io.BytesIO(data).read, made_by, layout)


@pytest.mark.parametrize("family,bits", [("llama", None), ("deepseek_v3", None),
                                         ("gemma3_text", None), ("ministral3", None),
                                         ("qwen3_next", None), ("gpt_oss", None),
                                         ("llama", 8)])
def test_the_handed_over_kv_decodes_as_a_prefill_of_its_own(tmp_path: Path, family, bits):
    import mlx.core as mx

    if bits:  # head_dim 64: quantized KV's groups are 64 (or 32) wide
        folder = make_tiny_model(tmp_path / family, hidden_size=256, num_attention_heads=4,
                                 num_key_value_heads=2)
    else:
        folder = make_family_model(tmp_path / family, family)
    model, _, _ = load_model(folder)
    kv = KV.for_model(model, bits)
    prompt = [(i * 37 + 11) % 200 + 3 for i in range(170)]
    tokens = prompt[:-1]
    adopted = adopt(model, kv, tokens, frames_of(model, kv, tokens), "m",
                    layout_of(model, kv))
    own = kv.make(model)
    for i in range(0, len(tokens), CHUNK):
        model(mx.array([tokens[i:i + CHUNK]]), cache=own)
    assert greedy(model, adopted, prompt[-1]) == greedy(model, own, prompt[-1])


def test_each_layers_rows_go_out_as_the_layer_makes_them(tmp_path: Path):
    """When the prefill's second chunk starts, the first chunk's rows of every layer are
    already in the file; and a decode side reading the file as it grows has taken them."""
    folder = make_family_model(tmp_path / "llama", "llama")
    model, _, _ = load_model(folder)
    kv = KV.for_model(model, None)
    tokens = [(i * 13) % 200 + 3 for i in range(150)]
    path = tmp_path / "kv.frames"
    path.touch()
    seen: dict[int, list[tuple[str, int]]] = {}
    taken: list[int] = []

    def progress(done: int) -> None:  # on the prefill's thread, after each chunk
        got = Reader(keep=False).feed(path.read_bytes())
        seen[done] = [(h["kind"], h.get("layer", -1)) for h, _ in got]

    cancel = threading.Event()
    result: dict[str, object] = {}

    def decode_side() -> None:
        try:
            result["cache"] = adopt_stream(model, kv, tokens, tail(path, cancel, 30), "m",
                                           layout_of(model, kv), progress=taken.append)
        except Exception as e:  # the assertion below says what
            result["error"] = e

    reader = threading.Thread(target=decode_side)
    reader.start()
    with path.open("wb") as out:
        prefill_stream(model, kv, tokens, out, threading.Event(), chunk=CHUNK,
                       made_by="m", progress=progress)
        out.write(END)
    reader.join(30)
    layers = len(kv.make(model))
    assert seen[CHUNK] == [("begin", -1)] + [("rows", i) for i in range(layers)]
    assert len(seen[2 * CHUNK]) == 1 + 2 * layers
    assert "error" not in result, result.get("error")
    assert taken == [CHUNK, 2 * CHUNK, 3 * CHUNK, len(tokens)]


def test_a_decode_side_waiting_on_a_file_stops_when_cancelled(tmp_path: Path):
    path = tmp_path / "kv.frames"
    path.write_bytes(b"")
    cancel = threading.Event()
    read = tail(path, cancel)
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(Cancelled):
        read(10)


def test_frames_that_are_not_this_models_cache_for_the_tokens_are_refused(tmp_path: Path):
    a = make_family_model(tmp_path / "a", "llama")
    b = make_family_model(tmp_path / "b", "deepseek_v3")
    model_a, _, _ = load_model(a)
    model_b, _, _ = load_model(b)
    kv = KV.for_model(model_a, None)
    kv_b = KV.for_model(model_b, None)
    tokens = list(range(3, 100))
    data = frames_of(model_a, kv, tokens, "a")
    with pytest.raises(BadRequest, match="another model"):
        adopt(model_b, kv_b, tokens, data, "b")
    with pytest.raises(BadRequest, match="not as this model keeps it"):  # a peer that lies
        adopt(model_b, kv_b, tokens, data, "a", layout_of(model_b, kv_b))
    with pytest.raises(BadRequest, match="other tokens"):
        adopt(model_a, kv, tokens[:-1] + [tokens[-1] + 1], data, "a")
    with pytest.raises(BadRequest, match="ended before"):  # cut short on the way
        adopt(model_a, kv, tokens, data[:len(data) // 2], "a")
    with pytest.raises(BadRequest, match="can't be read"):
        adopt(model_a, kv, tokens, b"\x00\x00\x00\x03abc" + b"\x00" * 64, "a")
    with pytest.raises(BadRequest, match="can't be read"):
        adopt(model_a, kv, tokens, b"\xff" * 64, "a")
    frames = split(data)
    with pytest.raises(BadRequest, match="out of order"):  # a chunk's rows twice
        adopt(model_a, kv, tokens, b"".join(frames[:2] + frames[1:]), "a")
    with pytest.raises(BadRequest, match="holds"):  # a chunk's rows missing
        adopt(model_a, kv, tokens, b"".join(frames[:1] + frames[-1:]), "a")
    failed = encode({"kind": "error", "message": "out of memory there"})
    with pytest.raises(BadRequest, match="out of memory there"):
        adopt(model_a, kv, tokens, frames[0] + failed, "a")


def split(data: bytes) -> list[bytes]:
    """The frames of `data`, each as its bytes."""
    out, at = [], 0
    reader = Reader()
    for header, payload in reader.feed(data):
        size = len(encode(header)) + len(payload)
        out.append(data[at:at + size])
        at += size
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_cache_in_another_float_dtype_is_taken_in_this_nodes(tmp_path: Path, dtype: str):
    """A Mac keeps its KV in float16 or bfloat16 (the checkpoint's), a CPU node in float32:
    the hand-over converts."""
    import mlx.core as mx
    import numpy as np

    folder = make_family_model(tmp_path / "llama", "llama")
    model, _, _ = load_model(folder)
    kv = KV.for_model(model, None)
    tokens = [(i * 13) % 200 + 3 for i in range(100)]
    data = frames_of(model, kv, tokens)
    half = b""
    for header, payload in Reader().feed(data):
        if "arrays" not in header:
            half += encode(header) + payload
            continue
        narrow = mx.array(np.frombuffer(payload, np.float32)).astype(getattr(mx, dtype))
        header["arrays"] = [[dtype, s] for _, s in header["arrays"]]
        half += encode(header) + np.array(narrow.view(mx.uint16)).tobytes()
    layout = layout_of(model, kv)
    got = adopt(model, kv, tokens, half, "m", layout)
    assert all(c.keys.dtype == mx.float32 for c in got)
    own = adopt(model, kv, tokens, data, "m", layout)
    assert greedy(model, got, 7, 6) == greedy(model, own, 7, 6)
