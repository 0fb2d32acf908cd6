"""engine/api/images.py and image_fetch.py: what a client's image becomes (an RGB PNG with
its pixels' hash), and that every hostile image or URL is a 400 naming its field, against
real local HTTP servers for fetching."""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from PIL import Image

from engine import protocol as wire
from engine.api import images
from engine.api.image_fetch import Policy, fetch, policy_from_env
from engine.api.images import Source
from engine.errors import BadRequest

OK_PARAM = "messages[0].content[1].image_url.url"


def encode(img: Image.Image, fmt: str = "PNG", **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def load(value: str, policy: Policy | None = None, media: str | None = None
         ) -> wire.ImageInput:
    return asyncio.run(images.load(Source(value, OK_PARAM, media), policy or Policy()))


def refused(value: str, policy: Policy | None = None, media: str | None = None) -> str:
    with pytest.raises(BadRequest) as e:
        load(value, policy, media)
    assert e.value.param == OK_PARAM
    return e.value.message


def pixels(img: wire.ImageInput) -> Image.Image:
    out = Image.open(io.BytesIO(base64.b64decode(img["data"])))
    assert out.format == "PNG" and out.mode == "RGB"
    return out


def noise(w: int = 64, h: int = 64) -> Image.Image:
    return Image.frombytes("RGB", (w, h), bytes((i * 7919) % 251 for i in range(w * h * 3)))


def red(w: int = 5, h: int = 3) -> Image.Image:
    return Image.new("RGB", (w, h), (200, 10, 10))


@pytest.mark.parametrize("fmt,mime,kw", [
    ("PNG", "image/png", {}), ("JPEG", "image/jpeg", {"quality": 100}),
    ("WEBP", "image/webp", {"lossless": True}), ("GIF", "image/gif", {})])
def test_each_format_becomes_an_rgb_png_with_its_size(fmt: str, mime: str,
                                                      kw: dict[str, Any]):
    got = load(data_url(encode(red(), fmt, **kw), mime))
    assert (got["width"], got["height"]) == (5, 3)
    assert pixels(got).size == (5, 3) and len(got["sha256"]) == 64


def test_the_hash_is_the_pixels_not_the_encoding():
    a = load(data_url(encode(red())))
    b = load(data_url(encode(red(), "WEBP", lossless=True), "image/webp"))
    c = load(data_url(encode(red(5, 4))))
    d = load(base64.b64encode(encode(Image.new("RGB", (5, 3), (200, 10, 11)))).decode())
    assert a["sha256"] == b["sha256"]
    assert len({a["sha256"], c["sha256"], d["sha256"]}) == 3


def test_raw_base64_is_sniffed_and_its_declared_type_checked():
    raw = base64.b64encode(encode(red(), "JPEG")).decode()
    assert load(raw)["width"] == 5  # Ollama: no type given
    assert load(raw, media="image/jpeg")["width"] == 5  # Anthropic: media_type
    assert "declared image/png but the data is JPEG" in refused(raw, media="image/png")


def test_transparency_is_on_white_and_animation_is_its_first_frame():
    clear = Image.new("RGBA", (2, 2), (0, 0, 0, 0))
    assert pixels(load(data_url(encode(clear)))).getpixel((0, 0)) == (255, 255, 255)
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    px = pixels(load(data_url(gif.getvalue(), "image/gif"))).getpixel((0, 0))
    assert px[0] > 200 and px[2] < 50


def test_exif_orientation_is_applied():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show
    raw = encode(red(8, 2), "JPEG", exif=exif.tobytes())
    got = load(data_url(raw, "image/jpeg"))
    assert (got["width"], got["height"]) == (2, 8)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(
        ">I", zlib.crc32(kind + body))


def bomb(w: int, h: int) -> bytes:
    """A grey PNG of w x h zero pixels: a few hundred KB that decode to w*h bytes."""
    z = zlib.compressobj(9)
    row = b"\0" * (w + 1)
    data = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0,
                                                                   0, 0))
            + png_chunk(b"IDAT", data) + png_chunk(b"IEND", b""))


@pytest.mark.parametrize("value,says", [
    (data_url(encode(noise())[:300]), "truncated or damaged"),
    (data_url(bomb(8000, 7000)), "8000x7000 pixels is over"),  # 56 MP, 55 KB
    (data_url(bomb(30000, 1)), "30000x1 pixels is over"),
    (data_url(encode(red()), "image/jpeg"), "declared image/jpeg but the data is PNG"),
    (data_url(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml"),
     "'image/svg+xml' is not an image type"),
    (data_url(b"hello", "text/plain"), "'text/plain' is not an image type"),
    (data_url(b"GIF89a not really"), "not a PNG, JPEG, WebP or GIF"),
    ("data:image/png;base64,!!!!", "not valid base64"),
    ("data:image/png,rawbytes", "must be data:image/<type>;base64"),
    ("iVBORw0KGgo=" * 3 + "@", "not valid base64"),
    ("file:///etc/passwd", "only data: URLs"),
    ("http://example.com/a.png", "doesn't fetch images from URLs"),
    (data_url(b"\0" * (images.MAX_BYTES + 1)), "over 20 MiB"),
])
def test_hostile_images_are_a_400_naming_the_field(value: str, says: str):
    assert says in refused(value)


def test_more_images_than_the_bound_is_a_400_naming_the_first_beyond():
    sources = [Source("x", f"messages[0].images[{i}]") for i in range(images.MAX_IMAGES + 1)]
    with pytest.raises(BadRequest) as e:
        images.pending(wire.GenerateRequest(), sources)
    assert e.value.param == f"messages[0].images[{images.MAX_IMAGES}]"


def test_the_vision_check_names_the_models_that_take_images():
    models = [("Qwen3-4B", ["generate"]), ("gemma-3-4b-it", ["generate", "vision"])]
    images.check_vision("gemma-3-4b-it", models, "p")
    images.check_vision(None, models, "p")  # the node picks: its worker decides
    images.check_vision("elsewhere", models, "p")  # another node's: it decides
    with pytest.raises(images.ImagesUnsupported) as e:
        images.check_vision("Qwen3-4B", models, "messages[0].content[1]")
    assert e.value.message == ("Qwen3-4B doesn't take images; models here that do: "
                               "gemma-3-4b-it.")
    assert (e.value.status, e.value.code, e.value.param) == (
        400, "images_unsupported", "messages[0].content[1]")
    with pytest.raises(images.ImagesUnsupported, match="none of the models here take images: "
                       "load a vision model such as"):
        images.check_vision(None, models[:1], "p")


def test_the_fetch_setting_is_off_unless_turned_on(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SHOAL_FETCH_IMAGES", raising=False)
    assert not policy_from_env().allowed
    monkeypatch.setenv("SHOAL_FETCH_IMAGES", "on")
    monkeypatch.setenv("SHOAL_FETCH_IMAGES_PRIVATE", "192.168.1.0/24, nonsense")
    p = policy_from_env()
    assert p.allowed and [str(n) for n in p.private] == ["192.168.1.0/24"]


Route = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture
def server() -> Iterator[Callable[[dict[str, Route]], str]]:
    """A real HTTP server on 127.0.0.1 answering each path with its route."""
    started: list[http.server.ThreadingHTTPServer] = []

    def start(routes: dict[str, Route]) -> str:
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                routes[self.path](self)

            def log_message(self, *a: Any) -> None:
                pass

        s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
        started.append(s)
        return f"http://127.0.0.1:{s.server_address[1]}"

    yield start
    for s in started:
        s.shutdown()
        s.server_close()


def send(body: bytes, kind: str = "image/png", length: bool = True) -> Route:
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", kind)
        if length:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return route


def redirect(to: str) -> Route:
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", to)
        h.send_header("Content-Length", "0")
        h.end_headers()
    return route


def slow(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "image/png")
    h.end_headers()
    h.wfile.write(b"\x89PNG")
    h.wfile.flush()
    time.sleep(3)


LOOPBACK = Policy(allowed=True, private=(__import__("ipaddress").ip_network("127.0.0.1/32"),))


def test_a_url_is_fetched_where_allowed(server: Callable[[dict[str, Route]], str]):
    base = server({"/a.png": send(encode(red())), "/r": redirect("/a.png"),
                   "/octet": send(encode(red(), "JPEG"), "application/octet-stream")})
    assert load(base + "/a.png", LOOPBACK)["width"] == 5
    assert load(base + "/r", LOOPBACK)["width"] == 5  # a redirect inside what's allowed
    assert load(base + "/octet", LOOPBACK)["width"] == 5  # no image type: the bytes say


@pytest.mark.parametrize("url,says", [
    ("http://127.0.0.1:{port}/a.png", "private, loopback or link-local address (127.0.0.1)"),
    ("http://localhost:{port}/a.png", "localhost is a private"),  # a name: its addresses
    ("http://169.254.169.254/latest/meta-data", "(169.254.169.254)"),
    ("http://10.1.2.3/a.png", "(10.1.2.3)"),
    ("http://[::1]:{port}/a.png", "(::1)"),
    ("http://[::ffff:127.0.0.1]:{port}/a.png", "(127.0.0.1)"),
    ("http://0.0.0.0:{port}/a.png", "(0.0.0.0)"),
])
def test_private_addresses_are_refused(server: Callable[[dict[str, Route]], str], url: str,
                                       says: str):
    base = server({"/a.png": send(encode(red()))})
    port = base.rsplit(":", 1)[1]
    assert says in refused(url.format(port=port), Policy(allowed=True))


@pytest.mark.parametrize("route,says", [
    (redirect("http://169.254.169.254/latest/meta-data"), "(169.254.169.254)"),
    (redirect("http://10.0.0.1/x.png"), "(10.0.0.1)"),
    (redirect("file:///etc/passwd"), "only http(s) URLs"),
    (slow, "took over 0.5 s"),
    (send(b"\0" * 5000), "over 4000 bytes"),
    (send(b"\0" * 5000, length=False), "over 4000 bytes"),
    (send(b"nope", "text/html"), "not a PNG, JPEG, WebP or GIF"),
    (send(encode(red()), "image/jpeg"), "declared image/jpeg but the data is PNG"),
])
def test_hostile_servers_are_a_400(server: Callable[[dict[str, Route]], str], route: Route,
                                   says: str):
    base = server({"/x": route, "/loop": redirect("/loop")})
    policy = Policy(allowed=True, private=LOOPBACK.private, timeout_s=0.5, max_bytes=4000)
    t0 = time.monotonic()
    assert says in refused(base + "/x", policy)
    assert time.monotonic() - t0 < 2.5
    assert "more than 5 redirects" in refused(base + "/loop", policy)


def test_fetch_refuses_when_off():
    with pytest.raises(BadRequest, match="doesn't fetch images"):
        asyncio.run(fetch("http://example.com/", "p", Policy()))


def test_a_requests_urls_are_fetched_together(server: Callable[[dict[str, Route]], str]):
    base = server({"/slow": slow})
    policy = Policy(allowed=True, private=LOOPBACK.private, timeout_s=0.5)
    req = images.pending(wire.GenerateRequest(), [
        Source(base + "/slow", f"messages[0].content[{i}].image_url.url") for i in range(4)])
    t0 = time.monotonic()
    with pytest.raises(BadRequest) as e:
        asyncio.run(images.resolve(req, policy))
    assert e.value.param == "messages[0].content[0].image_url.url"
    assert time.monotonic() - t0 < 1.5  # one bound, not four
