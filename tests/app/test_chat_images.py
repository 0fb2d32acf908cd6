"""Images in the chat, driven as a user drives them: the Image… button's file dialog, a
paste from the clipboard, a drop of a file; the thumbnails waiting above the message box
(removable) and in the sent message; the request the node gets (OpenAI content parts with
a data URL), and the node's refusal from the tiny text model as a sentence; pictures kept
with the conversation across a restart; hostile files refused in the app's own words."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image as Pillow
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import QApplication, QFileDialog

from app.chat import ChatPane
from app.conversations import ConversationStore
from app.tasks import Tasks
from engine.client import NodeClient


def picture(path: Path, size: tuple[int, int] = (120, 80), fmt: str = "PNG") -> Path:
    img = Pillow.new("RGB", size, (30, 120, 200))
    img.save(path, fmt)
    return path


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb(path: Path) -> Path:
    """A 300-byte PNG that claims 60,000 x 60,000 pixels."""
    head = struct.pack(">IIBBBBB", 60_000, 60_000, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", head)
                     + _chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + _chunk(b"IEND", b""))
    return path


@pytest.fixture
def make_pane(qtbot, home):
    """make(url) -> a chat pane on its own client, and the request bodies that client
    sent (recorded off the real socket's requests)."""
    tasks = Tasks()
    clients = []

    def make(url):
        client = NodeClient(url)
        clients.append(client)
        sent: list[dict] = []
        client._http.event_hooks["request"].append(
            lambda r: sent.append(json.loads(r.content)) if r.method == "POST" else None)
        pane = ChatPane(client, ConversationStore(home), tasks)
        qtbot.addWidget(pane)
        pane.resize(900, 600)
        pane.show()
        return pane, sent

    yield make
    tasks.cancel_streams()
    assert tasks.wait(20000)
    for c in clients:
        c.close()


def choose(monkeypatch, *paths: Path) -> None:
    """The file dialog answers with `paths` (only its static getter is replaced)."""
    monkeypatch.setattr(QFileDialog, "getOpenFileNames",
                        staticmethod(lambda *a, **k: ([str(p) for p in paths], "")))


def read(qtbot, pane) -> None:
    """Wait for the pictures being checked off the GUI thread."""
    qtbot.waitUntil(lambda: pane.pending.reading == 0, timeout=20000)


def attach(qtbot, pane) -> None:
    qtbot.mouseClick(pane.attach_button, Qt.MouseButton.LeftButton)
    read(qtbot, pane)


def waiting(pane) -> list[str]:
    return [t.label for t in pane.pending.strip.tiles if not t.isHidden()]


def test_an_attached_image_goes_as_a_content_part_and_a_text_model_refuses_it(
        qtbot, make_pane, tiny_node, home, tmp_path, monkeypatch):
    pane, sent = make_pane(tiny_node.url)
    pane.refresh_models()
    # the tiny text model doesn't take images, and the button says so before any send
    qtbot.waitUntil(lambda: "doesn't take images" in pane.attach_button.toolTip(),
                    timeout=20000)
    photo = picture(tmp_path / "photo.png")
    choose(monkeypatch, photo)
    attach(qtbot, pane)
    assert waiting(pane) == ["photo.png"] and pane.pending.strip.isVisible()
    assert not pane.pending.strip.tiles[0].picture.pixmap().isNull()

    pane.prompt.setPlainText("What is in this picture?")
    qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    assert waiting(pane) == [] and not pane.pending.strip.isVisible()
    you = pane.view.widgets()[0]
    assert not you.images.isHidden() and len(you.images.tiles) == 1
    assert not you.images.tiles[0].picture.pixmap().isNull()
    qtbot.waitUntil(lambda: not pane.streaming, timeout=60000)

    (body,) = [b for b in sent if "messages" in b]
    text, image = body["messages"][-1]["content"]
    assert text == {"type": "text", "text": "What is in this picture?"}
    url = image["image_url"]["url"]
    assert image["type"] == "image_url" and url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == photo.read_bytes()
    # the node's 400, as a sentence on the reply (not a crash, not silence)
    error = pane.view.widgets()[-1].error_label
    assert error.isVisible() and "tiny-llama doesn't take images" in error.text()
    assert "marked 'vision' in Models" in error.text()  # what to do, in the app's words
    assert "{" not in error.text() and "Traceback" not in error.text()
    assert tiny_node.client.health().ok  # the node lives

    # the picture is kept with the conversation, and comes back after a restart
    (conv,) = ConversationStore(home).conversations
    (name,) = conv.messages[0].images
    assert ConversationStore(home).image(name) == photo.read_bytes()
    again, _ = make_pane(tiny_node.url)
    assert len(again.view.widgets()[0].images.tiles) == 1
    assert conv.history(ConversationStore(home).image)[0]["content"][1] == image


def test_paste_and_drop_attach_and_a_thumbnail_can_be_removed(qtbot, make_pane, dead_url,
                                                              tmp_path):
    pane, _ = make_pane(dead_url)
    shot = QImage(64, 48, QImage.Format.Format_RGB32)
    shot.fill(QColor("orange"))
    QGuiApplication.clipboard().setImage(shot)
    pane.prompt.setFocus()
    pane.prompt.paste()
    read(qtbot, pane)
    assert waiting(pane) == ["Pasted image"] and pane.prompt.toPlainText() == ""

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(picture(tmp_path / "drop.jpg", fmt="JPEG")))])
    enter = QDragEnterEvent(QPoint(20, 20), Qt.DropAction.CopyAction, mime,
                            Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(pane, enter)
    assert enter.isAccepted()
    drop = QDropEvent(QPointF(20, 20), Qt.DropAction.CopyAction, mime,
                      Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(pane, drop)
    read(qtbot, pane)
    assert waiting(pane) == ["Pasted image", "drop.jpg"]
    assert pane.pending.images[1].mime == "image/jpeg"
    # a file dropped on the message box is a picture too, not its path as text
    pane.prompt.insertFromMimeData(mime)
    read(qtbot, pane)
    assert waiting(pane) == ["Pasted image", "drop.jpg"] and pane.prompt.toPlainText() == ""

    qtbot.mouseClick(pane.pending.strip.tiles[0].remove_button, Qt.MouseButton.LeftButton)
    assert waiting(pane) == ["drop.jpg"]
    qtbot.mouseClick(pane.pending.strip.tiles[0].remove_button, Qt.MouseButton.LeftButton)
    assert waiting(pane) == [] and not pane.pending.strip.isVisible()


def test_hostile_files_are_refused_in_the_apps_words(qtbot, make_pane, dead_url, tmp_path,
                                                     monkeypatch):
    pane, sent = make_pane(dead_url)
    good = picture(tmp_path / "good.png")
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:60])
    notes = tmp_path / "notes.png"
    notes.write_text("not a picture at all")
    strip = picture(tmp_path / "strip.png", (30_000, 2))
    huge = tmp_path / "huge.png"
    huge.write_bytes(good.read_bytes() + b"\0" * (21 * 2**20))
    bmp = picture(tmp_path / "old.bmp", fmt="BMP")
    cases = {cut: "damaged or cut short", notes: "isn't a PNG, JPEG, WebP or GIF",
             bomb(tmp_path / "bomb.png"): "too many pixels", strip: "30,000 x 2 pixels",
             huge: "is 22.0 MB: Shoal attaches images up to 20 MB", bmp: "isn't a PNG, JPEG"}
    for path, said in cases.items():
        choose(monkeypatch, path)
        attach(qtbot, pane)
        assert waiting(pane) == [], path
        assert pane.pending.note.isVisible() and said in pane.pending.note.text(), path
        assert path.name in pane.pending.note.text()
    # a good one beside a bad one: the good one waits, the bad one is named
    choose(monkeypatch, good, cut)
    attach(qtbot, pane)
    assert waiting(pane) == ["good.png"] and "cut.png" in pane.pending.note.text()
    assert sent == []  # nothing reached any node


def test_a_hand_edited_conversation_file_cannot_point_outside_its_images(home):
    (home / "conversations.json").write_text(json.dumps({"version": 1, "conversations": [{
        "id": "c1", "title": "t", "created": 1.0, "messages": [
            {"role": "user", "content": "hi",
             "images": ["../../etc/passwd", "/etc/hosts", "a" * 64 + ".png", 7]}]}]}))
    store = ConversationStore(home)
    (msg,) = store.conversations[0].messages
    assert msg.images == ["a" * 64 + ".png"]
    assert store.image("a" * 64 + ".png") is None  # gone: the message is sent as text
    assert store.conversations[0].history(store.image) == [{"role": "user", "content": "hi"}]
    assert store.image("../conversations.json") is None


@pytest.fixture
def dead_url(port):
    return f"http://127.0.0.1:{port}"  # nothing listens there


def test_pictures_decode_without_qt_reading_bad_bytes(qtbot):
    from app.attachments import Refused, from_bytes, thumbnail
    buf = io.BytesIO()
    Pillow.new("RGB", (8, 8)).save(buf, "WEBP")
    assert from_bytes(buf.getvalue(), "x.webp").mime == "image/webp"
    assert thumbnail(b"garbage", 64).isNull()
    with pytest.raises(Refused):
        from_bytes(b"GIF89a" + b"\0" * 10, "short.gif")


def test_a_photo_too_large_for_a_request_is_sent_reduced(qtbot, make_pane, dead_url,
                                                         tmp_path, monkeypatch):
    import os

    from app.attachments import SEND_BYTES
    pane, _ = make_pane(dead_url)
    noise = Pillow.frombytes("RGB", (3000, 2000), os.urandom(3000 * 2000 * 3))
    noise.save(tmp_path / "big.png")  # ~18 MB: under the 20 MB bound, over a request's
    choose(monkeypatch, tmp_path / "big.png")
    attach(qtbot, pane)
    (image,) = pane.pending.images
    assert len(image.data) <= SEND_BYTES and image.mime == "image/jpeg"
    assert max(image.width, image.height) <= 2048 and image.reduced_from == (3000, 2000)
    (label,) = waiting(pane)
    assert label.startswith("big.png (sent at ") and "3000 x 2000 original" in label


def test_images_no_conversation_names_are_deleted_at_the_next_start(home):
    import os
    import time
    kept, gone, fresh = ("a" * 64 + ".png", "b" * 64 + ".jpg", "c" * 64 + ".gif")
    (home / "images").mkdir()
    for name in (kept, gone, fresh):
        (home / "images" / name).write_bytes(b"x")
    old = time.time() - 2 * 3600
    for name in (kept, gone):
        os.utime(home / "images" / name, (old, old))
    (home / "conversations.json").write_text(json.dumps({"version": 1, "conversations": [{
        "id": "c1", "created": 1.0, "messages": [
            {"role": "user", "content": "", "images": [kept]}]}]}))
    ConversationStore(home)
    assert sorted(p.name for p in (home / "images").iterdir()) == [kept, fresh]
    # a file that can't be read deletes nothing: its conversations may name them all
    (home / "conversations.json").write_text("{ not json")
    ConversationStore(home)
    assert sorted(p.name for p in (home / "images").iterdir()) == [kept, fresh]


def test_the_buttons_tip_follows_what_the_node_says_and_survives_nonsense(qtbot, make_pane,
                                                                          dead_url):
    from engine.records import ModelCard
    pane, _ = make_pane(dead_url)

    def cards(**caps):
        return [ModelCard.from_json({"id": m, "shoal": {"capabilities": c}})
                for m, c in caps.items()]
    pane._fill_models(cards(eyes=["generate", "vision"], text=["generate"], odd=5,
                            minilm=["embed", "rerank"]))
    offered = [pane.model_picker.itemText(i) for i in range(pane.model_picker.count())]
    assert "minilm" not in offered and {"eyes", "text", "odd"} <= set(offered)
    for model, says in (("text", "text doesn't take images"), ("eyes", "Attach a PNG"),
                        ("odd", "Attach a PNG")):
        pane.model_picker.setCurrentText(model)
        assert says in pane.attach_button.toolTip(), model
    # the loaded worker's word wins over the card's
    pane.set_node_status({"state": "idle", "model": "text", "runner": {
        "type": "Ready", "model": "text", "capabilities": ["generate", "vision"]}})
    pane.model_picker.setCurrentText("text")
    assert "Attach a PNG" in pane.attach_button.toolTip()


def test_send_waits_for_a_picture_still_being_read(qtbot, make_pane, dead_url, tmp_path,
                                                   monkeypatch):
    pane, _ = make_pane(dead_url)
    choose(monkeypatch, picture(tmp_path / "slow.png"))
    pane.pending.reading += 1  # as while a large picture is checked
    pane.prompt.setPlainText("Look")
    pane.send()
    assert pane.view.widgets() == [] and pane.prompt.toPlainText() == "Look"
    assert "still being read" in pane.pending.note.text()
    pane.pending.reading -= 1


def test_a_message_queued_with_pictures_gives_them_back_when_cancelled(qtbot, make_pane,
                                                                       dead_url, tmp_path):
    from app.attachments import from_file
    pane, _ = make_pane(dead_url)
    image = from_file(picture(tmp_path / "q.png"))
    pane._queue("Then this", [image])  # as Send does while a reply streams
    assert "“Then this” with 1 image" in pane.queued_bar.label.text()
    pane._unqueue()
    assert pane.pending.images == [image] and pane.prompt.toPlainText() == "Then this"
