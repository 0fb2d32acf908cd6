"""Images in every API, as the official SDKs send them: what each protocol's parts become
(the turn's ordered parts and the request's images, from the JSON each SDK writes), and a
real node with a text model (and a tiny vision model beside it) answering each shape with
the 400 that names the models that take images; hostile images and URLs are a 400 naming
the field and the node answers the next request."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import io
import json
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import ollama
import openai
import pytest
from PIL import Image

from engine import protocol as wire
from engine.api import anthropic_schemas, common, images, ollama_schemas, responses_schemas
from engine.api.openai_chat import to_request as chat_request
from engine.api.openai_schemas import ChatCompletionRequest
from engine.errors import BadRequest
from nodes import NodeProcess, home_with

TINY = "tiny-llama"
VISION = "tiny-gemma3"


def png(w: int = 6, h: int = 4, color: tuple[int, int, int] = (10, 200, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return buf.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(raw)}"


def captured(send: Callable[[Any], Any], http: Any = httpx) -> dict[str, Any]:
    """The JSON body an SDK writes for one call (answered with a 400, not sent anywhere);
    `http`: the httpx the SDK is built on (anthropic's is httpx2)."""
    seen: list[bytes] = []

    def answer(r: Any) -> Any:
        seen.append(r.content)
        return http.Response(400, json={"error": {"message": "captured"}})

    with pytest.raises(Exception):  # noqa: B017 (each SDK raises its own error)
        send(http.MockTransport(answer))
    return json.loads(seen[0])


def resolved(req: wire.GenerateRequest) -> wire.GenerateRequest:
    return asyncio.run(images.resolve(req))


def test_openai_chat_parts_and_images_in_order_across_turns():
    body = captured(lambda t: openai.OpenAI(
        base_url="http://sdk/v1", api_key="k", max_retries=0,
        http_client=httpx.Client(transport=t)).chat.completions.create(
        model=TINY, messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "Compare"},
                {"type": "image_url", "image_url": {"url": url(png()), "detail": "low"}},
                {"type": "image_url", "image_url": {"url": url(png(3, 3))}}]},
            {"role": "assistant", "content": "Two pictures."},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url(png(2, 5))}},
                {"type": "text", "text": "and this?"}]}]))
    parsed = common.parse(ChatCompletionRequest, body)
    assert parsed.hints() == ["messages[].content[].image_url.detail"]
    req = resolved(chat_request(parsed))
    assert [m.get("parts") for m in req.messages or []] == [
        [{"type": "text", "text": "Compare"}, {"type": "image", "image": 0},
         {"type": "image", "image": 1}], None,
        [{"type": "image", "image": 2}, {"type": "text", "text": "and this?"}]]
    assert [m["content"] for m in req.messages or []] == ["Compare", "Two pictures.",
                                                          "and this?"]
    assert [(i["width"], i["height"]) for i in req.images or []] == [(6, 4), (3, 3), (2, 5)]
    assert type(req) is wire.GenerateRequest  # what the worker takes: no client bytes


def test_responses_input_image_and_its_file_id_refusal():
    def create(**input_item: Any) -> dict[str, Any]:
        return captured(lambda t: openai.OpenAI(
            base_url="http://sdk/v1", api_key="k", max_retries=0,
            http_client=httpx.Client(transport=t)).responses.create(
            model=TINY, input=[{"role": "user", "content": [
                {"type": "input_text", "text": "What is it?"},
                {"type": "input_image", "detail": "auto", **input_item}]}]))

    body = create(image_url=url(png()))
    req = resolved(responses_schemas.to_request(
        common.parse(responses_schemas.ResponsesRequest, body)))
    assert req.messages == [{"role": "user", "content": "What is it?", "parts": [
        {"type": "text", "text": "What is it?"}, {"type": "image", "image": 0}]}]
    assert req.images and req.images[0]["width"] == 6
    with pytest.raises(BadRequest) as e:
        responses_schemas.to_request(common.parse(responses_schemas.ResponsesRequest,
                                                  create(file_id="file-1")))
    assert e.value.param == "input[0].content[1].file_id"


def test_anthropic_image_blocks_and_images_in_tool_results():
    body = captured(lambda t: anthropic.Anthropic(
        base_url="http://sdk", api_key="k", max_retries=0,
        http_client=httpx2.Client(transport=t)).messages.create(
        model=TINY, max_tokens=5, messages=[
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": b64(png())}},
                {"type": "text", "text": "Take a screenshot"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "here:"},
                    {"type": "image", "source": {"type": "base64",
                                                 "media_type": "image/png",
                                                 "data": b64(png(2, 2))}}]},
                {"type": "text", "text": "What changed?"}]}]), httpx2)
    req = resolved(anthropic_schemas.to_request(
        common.parse(anthropic_schemas.MessagesRequest, body)))
    msgs = req.messages or []
    assert msgs[0]["parts"] == [{"type": "image", "image": 0},
                                {"type": "text", "text": "Take a screenshot"}]
    assert msgs[2] == {"role": "tool", "tool_call_id": "t1", "content": "here:", "parts": [
        {"type": "text", "text": "here:"}, {"type": "image", "image": 1}]}
    assert msgs[3] == {"role": "user", "content": "What changed?"}
    assert [i["width"] for i in req.images or []] == [6, 2]


def test_ollama_images_come_before_the_turns_text():
    def client(t: httpx.BaseTransport) -> ollama.Client:
        return ollama.Client(host="http://sdk", transport=t)

    chat = captured(lambda t: client(t).chat(model=TINY, messages=[
        {"role": "user", "content": "What is this?", "images": [png(), png(3, 3)]}]))
    req = resolved(ollama_schemas.chat_request(common.parse(ollama_schemas.ChatRequest,
                                                            chat)))
    assert (req.messages or [])[0]["parts"] == [
        {"type": "image", "image": 0}, {"type": "image", "image": 1},
        {"type": "text", "text": "What is this?"}]
    gen = captured(lambda t: client(t).generate(model=TINY, prompt="Describe",
                                                images=[png()]))
    req = resolved(ollama_schemas.generate_request(
        common.parse(ollama_schemas.GenerateRequest, gen)))
    assert req.images and (req.messages or [])[-1]["content"] == "Describe"
    with pytest.raises(BadRequest, match="raw prompt"):
        ollama_schemas.generate_request(common.parse(ollama_schemas.GenerateRequest,
                                                     {**gen, "raw": True}))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
         ) -> Iterator[NodeProcess]:
    """The tiny text model, a tiny vision model beside it, URL fetching on (and from
    127.0.0.1, where the tests' image server listens: every other private address is
    refused)."""
    from tiny_vision import make_tiny_gemma3

    home = home_with(tmp_path_factory.mktemp("images-node"), tiny_model_dir)
    make_tiny_gemma3(home / "models" / VISION)
    n = NodeProcess(home, TINY, env={"SHOAL_FETCH_IMAGES": "on",
                                     "SHOAL_FETCH_IMAGES_PRIVATE": "127.0.0.1/32"}
                    ).wait_healthy()
    try:
        n.wait_ready()
        yield n
    finally:
        n.stop()


UNSUPPORTED = f"{TINY} doesn't take images; models here that do: {VISION}."


def lives(n: NodeProcess) -> None:
    r = httpx.post(n.url + "/v1/chat/completions", timeout=60, json={
        "model": TINY, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text


def test_each_sdk_gets_the_400_naming_the_models_that_take_images(node: NodeProcess):
    oa = openai.OpenAI(base_url=node.url + "/v1", api_key="k", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=TINY, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what?"},
            {"type": "image_url", "image_url": {"url": url(png())}}]}])
    err = e.value.body
    assert isinstance(err, dict)
    assert (err["message"], err["code"], err["param"]) == (
        UNSUPPORTED, "images_unsupported", "messages[0].content[1].image_url.url")
    with pytest.raises(openai.BadRequestError, match="models here that do: tiny-gemma3"):
        oa.responses.create(model=TINY, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": url(png()), "detail": "auto"}]}])
    an = anthropic.Anthropic(base_url=node.url, api_key="k", max_retries=0, timeout=60)
    for content in ([{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                  "data": b64(png())}}],
                    [{"type": "tool_result", "tool_use_id": "t", "content": [
                        {"type": "image", "source": {"type": "base64",
                                                     "media_type": "image/png",
                                                     "data": b64(png())}}]}]):
        with pytest.raises(anthropic.BadRequestError, match="models here that do"):
            an.messages.create(model=TINY, max_tokens=5, messages=[
                {"role": "user", "content": content}])
    ol = ollama.Client(host=node.url, timeout=60)
    with pytest.raises(ollama.ResponseError) as oe:
        ol.chat(model=TINY, messages=[{"role": "user", "content": "what?",
                                       "images": [png()]}])
    assert oe.value.status_code == 400 and UNSUPPORTED in oe.value.error
    with pytest.raises(ollama.ResponseError, match="models here that do"):
        ol.generate(model=TINY, prompt="what?", images=[png()])
    lives(node)


def bomb(w: int, h: int) -> bytes:
    z = zlib.compressobj(9)
    data = b"".join(z.compress(b"\0" * (w + 1)) for _ in range(h)) + z.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def noisy_png() -> bytes:
    img = Image.frombytes("RGB", (64, 64), bytes((i * 7919) % 251 for i in range(64 * 64 * 3)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("image,says", [
    (url(noisy_png()[:300]), "truncated or damaged"),
    (url(bomb(30000, 1)), "30000x1 pixels is over"),
    (url(bomb(8000, 7000)), "8000x7000 pixels is over"),
    (url(png(), "image/jpeg"), "declared image/jpeg but the data is PNG"),
    ("data:image/png;base64,not base64!", "not valid base64"),
    ("http://127.0.0.2:1/a.png", "(127.0.0.2)"),
    ("http://[::1]:1/a.png", "(::1)"),
    ("http://169.254.169.254/latest/meta-data/", "(169.254.169.254)"),
    ("http://10.20.30.40/a.png", "(10.20.30.40)"),
    ("{base}/to-metadata", "(169.254.169.254)"),
    ("{base}/to-private", "(192.168.0.1)"),
    ("{base}/huge", "over 20 MiB"),
    ("{base}/missing", "answered 404"),
    ("ftp://127.0.0.1/a.png", "only data: URLs"),
])
def test_hostile_images_are_a_400_and_the_node_lives(node: NodeProcess, image_server: str,
                                                     image: str, says: str):
    r = httpx.post(node.url + "/v1/chat/completions", timeout=60, json={
        "model": TINY, "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url(png())}},
            {"type": "image_url", "image_url": {"url": image.format(base=image_server)}}]}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert says in err["message"] and err["param"] == "messages[0].content[1].image_url.url"
    lives(node)


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1: an image, redirects to private addresses, 21 MiB."""
    routes: dict[str, tuple[int, dict[str, str], bytes]] = {
        "/a.png": (200, {"Content-Type": "image/png"}, png()),
        "/to-metadata": (302, {"Location": "http://169.254.169.254/latest/"}, b""),
        "/to-private": (307, {"Location": "http://192.168.0.1/a.png"}, b""),
        "/huge": (200, {"Content-Type": "image/png"}, b"\0" * (21 * 2**20))}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, headers, body = routes.get(self.path, (404, {}, b""))
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            with contextlib.suppress(OSError):  # the node stops reading at its bound
                self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{s.server_address[1]}"
    finally:
        s.shutdown()
        s.server_close()


def test_a_fetched_image_reaches_the_model_check(node: NodeProcess, image_server: str):
    r = httpx.post(node.url + "/v1/messages", timeout=60, json={
        "model": TINY, "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": image_server + "/a.png"}}]}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == UNSUPPORTED
    lives(node)


def test_too_many_images_is_a_400_naming_the_first_beyond(node: NodeProcess):
    r = httpx.post(node.url + "/api/chat", timeout=60, json={
        "model": TINY, "stream": False, "messages": [
            {"role": "user", "content": "x", "images": [b64(png())] * 17}]})
    assert r.status_code == 400 and f"at most {images.MAX_IMAGES}" in r.json()["error"]
    lives(node)


def test_vllms_processor_kwargs_with_images_are_refused():
    body = {"model": TINY, "mm_processor_kwargs": {"max_pixels": 1000}, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(png())}}]}]}
    with pytest.raises(BadRequest) as e:
        chat_request(common.parse(ChatCompletionRequest, body))
    assert e.value.param == "mm_processor_kwargs"


def test_each_sdks_image_reaches_a_vision_model(node: NodeProcess):
    """Last here: it switches the node to the vision model. Each SDK's shape is answered,
    and the image's tokens are in the prompt's count."""
    oa = openai.OpenAI(base_url=node.url + "/v1", api_key="k", max_retries=0, timeout=120)
    ask = [{"type": "text", "text": "what?"}]
    text = oa.chat.completions.create(model=VISION, max_tokens=2, temperature=0,
                                      messages=[{"role": "user", "content": ask}])
    seen = oa.chat.completions.create(model=VISION, max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": [*ask, {"type": "image_url",
                                            "image_url": {"url": url(png())}}]}])
    assert text.usage and seen.usage
    assert seen.usage.prompt_tokens > text.usage.prompt_tokens
    r = oa.responses.create(model=VISION, max_output_tokens=2, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "what?"},
                                     {"type": "input_image", "image_url": url(png()),
                                      "detail": "auto"}]}])
    assert r.usage and r.usage.input_tokens == seen.usage.prompt_tokens
    an = anthropic.Anthropic(base_url=node.url, api_key="k", max_retries=0, timeout=120)
    m = an.messages.create(model=VISION, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": b64(png())}}]}])
    read = m.usage.cache_read_input_tokens or 0  # Anthropic counts the cache's part apart
    assert m.usage.input_tokens + read == seen.usage.prompt_tokens
    ol = ollama.Client(host=node.url, timeout=120)
    c = ol.chat(model=VISION, options={"num_predict": 2}, messages=[
        {"role": "user", "content": "what?", "images": [png()]}])
    assert (c.prompt_eval_count or 0) > text.usage.prompt_tokens
    g = ol.generate(model=VISION, prompt="what?", images=[png()], options={"num_predict": 2})
    assert g.done
    # Ollama's /api/show says which model takes images (clients check before offering it)
    caps = {m: httpx.post(node.url + "/api/show", json={"model": m}, timeout=30).json()
            ["capabilities"] for m in (VISION, TINY)}
    assert "vision" in caps[VISION] and "completion" in caps[VISION]
    assert "vision" not in caps[TINY]
