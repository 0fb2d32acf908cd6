"""Every error a person reads is a sentence about their machines and models: one per code
a node sends (the table must cover every code the engine defines), none with errno, httpx,
routes, log paths or ranks, naming the machine to blame; the technical text one click away.
Transport failures are the real ones engine.client raises."""

import ast
import re
import socket
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.common import message_of
from app.error_note import ErrorNote
from app.sentences import SENTENCES, explain
from engine.client import NodeClient
from engine.errors import PeerUnreachable, ShoalError, WorkerFailed, _all_subclasses

ENGINE = Path(__file__).resolve().parents[2] / "engine"
STUDIO, LAPTOP = "a1b2c3d4e5f6", "0f0f0f0f0f0f"
NAMES = {STUDIO: "studio", LAPTOP: "laptop"}
# What the node's text may carry that a person should not have to read.
INTERNALS = re.compile(r"errno|httpx|/v1|/shoal|\.log\b|\brank\b|127\.0\.0\.1|"
                       + STUDIO, re.I)
NOISE = (f"rank 1 on node {STUDIO} failed: it exited (exit code 1) while serving request "
         f"9f3e2a; its log is /home/me/.shoal/logs/worker-tiny.log on studio. The node at "
         f"http://127.0.0.1:5001 did not answer /shoal/peer/instances: [Errno 111] "
         f"Connection refused (GET /v1/models)")


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


@pytest.mark.parametrize("code", sorted(SENTENCES))
def test_each_code_is_a_sentence_naming_the_machine(code):
    error = ShoalError(NOISE, code=code, node=STUDIO)
    said = explain(error, NAMES)
    assert not INTERNALS.search(said.sentence), said.sentence
    assert "studio" in said.sentence and "laptop" not in said.sentence
    assert said.sentence.endswith(".") and said.sentence[0].isupper()
    once = sentences(said.sentence)
    assert len(once) == len(set(once)), said.sentence  # nothing said twice
    # ... and the technical text is all still there, for Details.
    assert "Errno 111" in said.detail and "worker-tiny.log" in said.detail
    assert STUDIO in said.detail


def codes_in_engine() -> set[str]:
    """Every error code the engine's source sends: class attributes (code = "..."),
    keyword arguments (code="...") and the worker's own (fatal("...", ...),
    Fatal("...", ...), Error(rid, "...", ...))."""
    found: set[str] = set()
    for path in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "code" for t in node.targets) \
                    and isinstance(node.value, ast.Constant) and \
                    isinstance(node.value.value, str):
                found.add(node.value.value)
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg == "code" and isinstance(kw.value, ast.Constant) \
                            and isinstance(kw.value.value, str):
                        found.add(kw.value.value)
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                at = {"fatal": 0, "Fatal": 0, "Error": 1}.get(name)
                if at is not None and len(node.args) > at:
                    arg = node.args[at]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
                            and re.fullmatch(r"[a-z_]+", arg.value):
                        found.add(arg.value)
    return found


def test_the_table_covers_every_code_the_engine_sends():
    import engine.api.common  # noqa: F401 - modules that define ShoalError subclasses
    import engine.api.cors  # noqa: F401
    import engine.cluster.auth  # noqa: F401
    import engine.hub.errors  # noqa: F401
    classes = {c.code for c in _all_subclasses(ShoalError) if c.code}
    assert {"worker_failed", "peer_unreachable", "model_not_found", "overloaded",
            "gated_model", "not_in_cluster"} <= classes  # the introspection sees them
    sent = classes | codes_in_engine()
    assert {"peer_lost", "wrong_node", "kv_bits_refused"} <= sent  # so does the scan
    missing = sorted(sent - set(SENTENCES))
    assert not missing, f"codes without a sentence in app/sentences.py: {missing}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raised(call) -> BaseException:
    with pytest.raises(ShoalError) as info:
        call()
    return info.value


def test_nothing_on_the_port_is_a_node_that_isnt_running():
    port = free_port()  # nothing listens there
    with NodeClient(f"http://127.0.0.1:{port}", timeout=5) as client:
        for error in (raised(client.status), raised(lambda: client.chat(
                [{"role": "user", "content": "Hi"}]))):
            assert isinstance(error, PeerUnreachable) and "Errno" in error.message
            said = explain(error)
            assert said.code == "connection_refused"
            assert said.sentence.startswith("Can't reach the node on this computer")
            assert "starts its node again" in said.sentence
            assert not INTERNALS.search(said.sentence)
            assert "Connection refused" in said.detail and str(port) in said.detail
            assert message_of(error) == said.sentence  # what every view shows
    # The same address, known as another machine: that machine is named, not this one.
    with NodeClient(f"http://127.0.0.1:{port}", timeout=5) as client:
        said = explain(raised(client.status), {f"127.0.0.1:{port}": "mini"})
    assert "on mini" in said.sentence and "this computer" not in said.sentence
    assert "Open Shoal on mini" in said.sentence


@pytest.fixture
def listener():
    """A socket that takes connections and answers nothing (or hangs up, if told to)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    hang_up = threading.Event()
    kept: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(65536)
            if hang_up.is_set():
                conn.close()
            else:
                kept.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], hang_up
    server.close()
    for conn in kept:
        conn.close()


def test_a_silent_node_and_one_that_hangs_up(listener):
    port, hang_up = listener
    with NodeClient(f"http://127.0.0.1:{port}", timeout=0.5) as client:
        silent = explain(raised(client.status))
        hang_up.set()
        cut = explain(raised(client.status))
    assert silent.code == "timeout" and "took too long" in silent.sentence
    assert cut.code == "connection_reset" and "broke off" in cut.sentence
    for said in (silent, cut):
        assert not INTERNALS.search(said.sentence) and "this computer" in said.sentence
        assert "Timeout" in said.detail or "Disconnected" in said.detail \
            or "disconnected" in said.detail


def test_the_machine_that_left_is_blamed_not_the_one_reporting():
    # laptop owns the model; its rank 0 lost mini (rank 1) and says so, with the heal hint.
    error = ShoalError("node 0f0f0f0f0f0f: Rank 0 lost rank 1 (127.0.0.1:5002) of the "
                       "model's group: connection closed. Shoal is placing tiny again on the "
                       "nodes that remain; retry in a minute (GET /shoal/instances says how "
                       "it goes).", code="peer_lost", node=None)
    said = explain(error, {**NAMES, "127.0.0.1:5002": "mini"})
    assert "mini, which held part of it" in said.sentence
    assert "laptop" not in said.sentence
    # The node's own word on what Shoal does replaces the table's, said once.
    assert said.sentence.count("Shoal is placing tiny again on the machines that remain") == 1
    assert SENTENCES["peer_lost"].doing not in said.sentence
    assert SENTENCES["peer_lost"].todo not in said.sentence  # "retry in a minute" says it


def test_a_worker_that_died_on_another_machine():
    error = WorkerFailed(f"rank 1 on node {STUDIO} failed: The worker for tiny-llama exited "
                         "unexpectedly: it was killed (SIGKILL) while serving request 3f2a9c; "
                         "its log is /home/me/.shoal/logs/worker.log on studio.", node=STUDIO)
    said = explain(error, NAMES)
    assert said.sentence.startswith("tiny-llama stopped on studio (it was stopped by the "
                                     "system, most often for want of memory).")
    assert "SIGKILL" not in said.sentence and "SIGKILL" in said.detail
    assert "3f2a9c" not in said.sentence


def test_what_the_node_already_advises_is_not_advised_again():
    error = ShoalError("The prompt has 9000 tokens and tiny takes 8192; shorten it or start "
                       "a new conversation.", code="context_length_exceeded")
    assert explain(error).sentence == error.message
    # Its own words, when the table has nothing to add, are cleaned of file paths.
    damaged = ShoalError("The model file /home/me/.shoal/models/tiny/model.safetensors is "
                         "truncated or damaged. Delete the model and download it again.",
                         code="corrupt_model")
    assert explain(damaged).sentence == ("The model file model.safetensors is truncated or "
                                         "damaged. Delete the model and download it again.")


def test_an_app_bug_is_not_dressed_as_the_node():
    said = explain(KeyError("runner"))
    assert said.sentence.startswith("Something unexpected went wrong in Shoal")
    assert "KeyError" in said.detail and "runner" not in said.sentence


def test_the_note_reveals_its_details_on_a_click(qtbot):
    note = ErrorNote()
    qtbot.addWidget(note)
    note.show()
    with NodeClient(f"http://127.0.0.1:{free_port()}", timeout=5) as client:
        note.show_error(raised(client.status), prefix="Couldn't list models: ")
    assert note.text.text().startswith("Couldn't list models: Can't reach the node on this")
    assert "Errno" not in note.text.text()
    assert note.details_button.isVisible() and not note.detail.isVisible()
    qtbot.mouseClick(note.details_button, Qt.MouseButton.LeftButton)
    assert note.detail.isVisible() and "[Errno 111] Connection refused" in note.detail.text()
    assert note.detail.textInteractionFlags() & Qt.TextInteractionFlag.TextSelectableByMouse
    qtbot.mouseClick(note.details_button, Qt.MouseButton.LeftButton)
    assert not note.detail.isVisible()
    note.set_text("All good.")
    assert not note.details_button.isVisible()


def test_the_developer_log_gives_a_refusal_in_words_and_the_node_s_behind_details(qtbot):
    from app.developer import DeveloperPanel
    from engine.records import RequestInfo
    panel = DeveloperPanel("http://127.0.0.1:1", None)
    qtbot.addWidget(panel)
    panel.show()
    reason = ("The worker for tiny-llama exited unexpectedly: it was killed (SIGKILL) while "
              "serving request 3f2a9c; its log is /home/me/.shoal/logs/worker.log on box.")
    panel._node_log([
        RequestInfo(at=1.0, method="POST", path="/v1/chat/completions", status=500,
                    seconds=0.4, client="curl", reason=reason),
        RequestInfo(at=2.0, method="GET", path="/v1/models", status=200, seconds=0.01,
                    client="curl")])
    failed = panel.log_table.item(1, 4)
    assert failed.text().startswith("tiny-llama stopped on this computer")
    assert "SIGKILL" not in failed.text() and ".log" not in failed.text()
    assert not panel.failure.isVisible()
    panel.log_table.setCurrentCell(1, 0)
    assert panel.failure.isVisible() and "tiny-llama stopped" in panel.failure.text.text()
    qtbot.mouseClick(panel.failure.details_button, Qt.MouseButton.LeftButton)
    assert "SIGKILL" in panel.failure.detail.text()
    panel.log_table.setCurrentCell(0, 0)  # an answered request has nothing to explain
    assert not panel.failure.isVisible()


def test_every_view_names_the_machines_the_app_knows(monkeypatch):
    from app import sentences
    monkeypatch.setattr(sentences, "KNOWN", {})
    error = ShoalError.from_openai({"error": {
        "message": f"node {STUDIO}: The model 'tiny' is not on this node.",
        "code": "model_not_found", "node": STUDIO}}, 502)
    assert message_of(error).startswith("The model 'tiny' is not on that machine.")
    sentences.remember({STUDIO: "studio"})  # as a status or topology snapshot tells it
    assert message_of(error).startswith("The model 'tiny' is not on studio.")


def test_a_file_the_app_cant_write_names_the_file_and_the_reason(tmp_path):
    folder = tmp_path / "not-a-folder"
    folder.write_text("")
    with pytest.raises(OSError) as info:
        (folder / "conversations.json").write_text("[]")
    said = explain(info.value)
    assert said.sentence.startswith("Shoal couldn't use conversations.json (not a directory) "
                                    "on this computer.")
    assert str(tmp_path) not in said.sentence and str(tmp_path) in said.detail


def test_the_topology_teaches_every_view_machine_names():
    """A topology snapshot names the machines: an error about a peer's id or address then
    names the machine, in every view that shows it."""
    from app.cluster_state import remember_machines
    remember_machines({"nodes": [{"id": "a1b2c3d4e5f6", "name": "studio",
                                  "url": "https://10.0.0.7:52416"},
                                 {"id": "0f0f0f0f0f0f", "name": "mini", "self": True}]})
    said = explain(PeerUnreachable("node a1b2c3d4e5f6 stopped answering")).sentence
    assert "studio" in said and "a1b2c3d4e5f6" not in said


def test_the_hub_unreachable_blames_this_computer_not_the_hubs_address():
    """The Hub's address in the node's text is not a machine of the cluster."""
    from engine.errors import ShoalError
    said = explain(ShoalError("Can't reach https://127.0.0.1:9/api/models/x: refused",
                              code="hub_unreachable")).sentence
    assert "this computer" in said and "another machine" not in said
