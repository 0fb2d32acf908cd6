"""The copies of a model in the app (issue 50, item 2): the replicas view shows the copies
of each model together with their load and share of requests, hides while no model runs
as more than one copy, and leaves nothing stale on screen when the node stops answering;
the launch panel's Copies box asks the node for that many copies and says where each runs.

The node in most tests is a stand-in: a small real aiohttp server in this process that
answers the node's two routes (GET /shoal/replicas, POST /shoal/instances) with the JSON
of engine.records' ReplicasInfo and LaunchedReplicas and records what the app sent. It was
written while the node's routes were built beside this view, and it stays because it
answers what a real node can't be made to (a 500, garbage, exact loads and shares); the
last test runs the same against two real nodes."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, QRect, Qt

from app.cluster_state import ClusterState
from app.launch import LaunchPanel
from app.replicas_view import UNREACHABLE, ReplicasView
from app.tasks import Tasks
from engine.client import NodeClient
from engine.records import InstanceInfo, LaunchedReplicas, RankInfo, ReplicaInfo, ReplicasInfo

NAMES = {"aaaa": "studio", "bbbb": "mini", "cccc": "laptop"}
MODEL = "llama-3-8b"


def replica(node: str, model: str = MODEL, share: float = 0.0, routed: int = 0,
            running: int = 0, waiting: int = 0, nodes: list[str] | None = None,
            strategy: str = "single") -> dict[str, Any]:
    return ReplicaInfo(model=model, node=node, name=NAMES[node], strategy=strategy,
                       nodes=nodes or [node], here=node == "aaaa", running=running,
                       waiting=waiting, streams=4, routed=routed, share=share).to_json()


TWO_COPIES = ReplicasInfo.from_json({"replicas": [
    replica("aaaa", share=0.41, routed=41, running=3, waiting=2),
    replica("bbbb", share=0.59, routed=59, running=1, nodes=["bbbb", "cccc"],
            strategy="pipeline"),
    replica("cccc", model="qwen-0.5b", share=1.0, routed=7)]}).to_json()
ONE_COPY = {"replicas": [replica("aaaa", share=1.0, routed=3)]}


class StandIn:
    """GET /shoal/replicas answers `replicas` (a dict: JSON; bytes: sent as they are,
    with `status`); POST /shoal/instances records its body and answers LaunchedReplicas
    of one copy per machine, as the node does, or `launch_error` (an OpenAI error body,
    HTTP 507); POST /shoal/unload is recorded; POST /shoal/replicas/stop records its body
and takes that copy out of the answer, as the node does, or answers `stop_error` (404)."""

    def __init__(self) -> None:
        self.replicas: dict[str, Any] | bytes = TWO_COPIES
        self.status = 200
        self.launch_error: dict[str, Any] | None = None
        self.launches: list[dict[str, Any]] = []
        self.stops: list[str] = []  # the routes the app stopped copies with
        self.stopped: list[dict[str, Any]] = []  # POST /shoal/replicas/stop's bodies
        self.stop_error: dict[str, Any] | None = None
        self.asked = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the stand-in node didn't start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        from aiohttp import web

        async def replicas(_request: web.Request) -> web.Response:
            self.asked += 1
            body = self.replicas
            if isinstance(body, bytes):
                return web.Response(body=body, status=self.status,
                                    content_type="application/json")
            return web.json_response(body, status=self.status)

        async def launch(request: web.Request) -> web.Response:
            body = await request.json()
            self.launches.append(body)
            if self.launch_error is not None:
                return web.json_response(self.launch_error, status=507)
            n = int(body.get("replicas") or 1)
            if n > 1 and body.get("nodes"):  # as the real node refuses it
                return web.json_response({"error": {
                    "message": "'replicas' places each copy itself: leave 'nodes' out",
                    "type": "invalid_request_error", "param": "replicas"}}, status=400)
            copies = [InstanceInfo(None, body["model"], "single", ranks=[RankInfo(0, nid)])
                      for nid in list(NAMES)[:n]]
            if n == 1:
                return web.json_response(copies[0].to_json(), status=201)
            return web.json_response(LaunchedReplicas(body["model"], copies).to_json(),
                                     status=201)

        async def stop(request: web.Request) -> web.Response:
            self.stops.append(request.path)
            return web.json_response({"state": "idle"})

        async def stop_copy(request: web.Request) -> web.Response:
            body = await request.json()
            self.stopped.append(body)
            if self.stop_error is not None:
                return web.json_response(self.stop_error, status=404)
            assert isinstance(self.replicas, dict)
            rows = self.replicas["replicas"]
            gone = next(r for r in rows if (r["model"], r["node"]) == (body["model"],
                                                                         body["node"]))
            self.replicas = {"replicas": [r for r in rows if r is not gone]}
            return web.json_response(gone)

        async def start() -> None:
            app = web.Application()
            app.router.add_get("/shoal/replicas", replicas)
            app.router.add_post("/shoal/instances", launch)
            app.router.add_post("/shoal/unload", stop)
            app.router.add_post("/shoal/replicas/stop", stop_copy)
            runner = self._runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._ready.set()

        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def node():
    server = StandIn()
    yield server
    server.close()


@pytest.fixture
def tasks():
    t = Tasks()
    yield t
    assert t.wait(15000)


@pytest.fixture
def view(qtbot, node, tasks):
    client = NodeClient(node.url, timeout=3.0)
    v = ReplicasView(client, tasks, NAMES.get, interval=0.1)
    qtbot.addWidget(v)
    v.start()
    yield v
    v.stop()
    client.close()


def texts(v: ReplicasView) -> list[list[str]]:
    """What the rows say on screen, one list per row (headers as one-item rows)."""
    out = []
    for model, rows in v.groups:
        out.append([v._headers[[m for m, _ in v.groups].index(model)].text()])
        for c in rows:
            w = v._rows[(model, c.key)]
            out.append([w.machines.text(), w.how.text(), w.load.text(), w.share.text()])
    return out


def test_two_copies_show_together_with_their_share(qtbot, node, view):
    qtbot.waitUntil(lambda: view.isVisible() and bool(view.groups), timeout=5000)
    assert texts(view) == [
        [f"{MODEL}: 2 copies"],
        ["studio (this machine)", "on 1 machine", "3 of 4 answering, 2 waiting",
         "41% of requests"],
        ["mini and laptop", "on 2 machines, split by layers", "1 of 4 answering",
         "59% of requests"]]
    assert "qwen" not in " ".join(sum(texts(view), []))  # one copy: not a row
    assert not view.error_label.isVisible()
    bar = view._rows[(MODEL, "aaaa")].bar
    assert (bar.running, bar.waiting, bar.streams) == (3, 2, 4)

    node.replicas = ONE_COPY  # the second copy stopped: nothing to compare, no view
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5000)
    assert view.groups == [] and view.error is None


@pytest.mark.parametrize("status, body", [
    (500, json.dumps({"error": {"message": "boom", "type": "server_error"}}).encode()),
    (200, b"<html>not a node</html>"),
    (200, json.dumps({"replicas": [{"model": MODEL, "node": "aaaa", "running": "lots"}]}
                     ).encode()),
    (200, json.dumps({"replicas": "nope"}).encode()),
])
def test_a_node_that_fails_leaves_nothing_stale(qtbot, node, view, status, body):
    qtbot.waitUntil(lambda: len(view._rows) == 2, timeout=5000)
    node.replicas, node.status = body, status
    qtbot.waitUntil(lambda: view.error_label.isVisible(), timeout=5000)
    assert view.error_label.text() == UNREACHABLE
    assert view.groups == [] and not view._rows  # no load from before left on screen
    assert view.isVisible()
    asked = node.asked
    qtbot.waitUntil(lambda: node.asked >= asked + 2, timeout=5000)  # still asking
    assert view.error_label.text() == UNREACHABLE

    node.replicas, node.status = TWO_COPIES, 200  # back: the rows return, the line goes
    qtbot.waitUntil(lambda: len(view._rows) == 2, timeout=5000)
    assert not view.error_label.isVisible()


def test_stop_on_a_row_stops_that_copy_alone(qtbot, node, view):
    """Stop on the copy that runs on mini and laptop asks the app's node to stop that
    copy (by the node that answers for it), whichever machine it runs on; the row goes."""
    qtbot.waitUntil(lambda: len(view._rows) == 2, timeout=5000)
    row = view._rows[(MODEL, "bbbb")]
    assert row.stop.isVisible() and row.stop.text() == "Stop"
    qtbot.mouseClick(row.stop, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5000)  # one copy left: no view
    assert node.stopped == [{"model": MODEL, "node": "bbbb"}]
    assert node.stops == []  # nothing unloaded on the app's own machine
    assert not view.stop_label.isVisible()


def test_a_refused_stop_says_the_nodes_sentence_and_the_row_stays(qtbot, node, view):
    qtbot.waitUntil(lambda: len(view._rows) == 2, timeout=5000)
    said = "No copy of 'llama-3-8b' runs on the node 'bbbb' now: it stopped already."
    node.stop_error = {"error": {"message": said, "type": "invalid_request_error",
                                 "param": "node", "code": "copy_not_found"}}
    row = view._rows[(MODEL, "bbbb")]
    qtbot.mouseClick(row.stop, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.stop_label.isVisible(), timeout=5000)
    assert view.stop_label.text().startswith(
        f"Couldn't stop the copy of {MODEL} on mini and laptop: {said}")
    assert view.stop_label.toolTip() == said
    qtbot.waitUntil(lambda: row.stop.isEnabled(), timeout=5000)
    assert row.stop.text() == "Stop" and len(view._rows) == 2
    asked = node.asked
    qtbot.waitUntil(lambda: node.asked >= asked + 2, timeout=5000)  # refreshes keep it
    assert view.stop_label.isVisible()


def test_an_unreachable_node_never_shows_copies_it_never_had(qtbot, node, tasks):
    node.replicas, node.status = b"garbage", 200  # before the view's first question
    client = NodeClient(node.url, timeout=3.0)
    view = ReplicasView(client, tasks, NAMES.get, interval=0.1)
    qtbot.addWidget(view)
    view.start()
    try:
        qtbot.waitUntil(lambda: node.asked >= 3, timeout=5000)
        assert not view.isVisible()  # nothing was on screen: nothing to take back
    finally:
        view.stop()
        client.close()


def topology() -> dict[str, Any]:
    return {"nodes": [{"id": nid, "name": name, "self": nid == "aaaa", "reachable": True,
                       "trusted": True, "state": "idle"} for nid, name in NAMES.items()],
            "links": []}


@pytest.fixture
def panel(qtbot, node, tasks):
    client = NodeClient(node.url, timeout=5.0)
    state = ClusterState(tasks, client)
    state.set_topology(topology())
    p = LaunchPanel(client, tasks, state)
    qtbot.addWidget(p)
    p.resize(900, 400)
    p.show()
    p.set_placement(MODEL, "pipeline", "ring", [("aaaa", (0, 32))])
    yield p
    p.replicas.stop()
    client.close()


def test_copies_launch_as_replicas_and_say_where_each_runs(qtbot, node, panel):
    assert panel.copies_spin.value() == 1
    assert (panel.copies_spin.minimum(), panel.copies_spin.maximum()) == (1, 16)
    panel.copies_spin.setValue(3)
    qtbot.mouseClick(panel.launch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.state_text in ("Ready", "Failed"), timeout=10000)
    sent = node.launches[-1]
    assert (sent["replicas"], sent["model"], sent["nodes"]) == (3, MODEL, [])
    assert panel.state_text == "Ready", panel.headline.text()
    assert panel.headline.text().startswith(
        f"Ready: 3 copies of {MODEL} run: one on studio; one on mini; one on laptop.")
    assert [r.name.text() for r in panel.rows.values()] == ["studio", "mini", "laptop"]
    # the copies, as the node reports them, show under the panel
    qtbot.waitUntil(lambda: panel.replicas.isVisible() and bool(panel.replicas.groups),
                    timeout=5000)
    # Stop: the copy here is unloaded; the node can't stop one alone on another machine
    # (it has no id to stop it by), and the panel says so rather than "Stopped"
    qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.state_text == "Stopped", timeout=10000)
    assert node.stops == ["/shoal/unload"]
    assert panel.headline.text() == ("Stopped, but not the copies on mini and laptop: stop "
                                     "them in Shoal on those machines.")

    panel.copies_spin.setValue(1)  # one copy: the request is today's, without "replicas"
    qtbot.mouseClick(panel.launch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(node.launches) == 2 and panel.state_text == "Ready",
                    timeout=10000)
    assert "replicas" not in node.launches[-1]
    assert panel.headline.text().startswith(f"Ready: {MODEL} runs on 1 machine.")
    # a model alone on this machine has no instance id: Stop unloads it
    qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.state_text == "Stopped", timeout=10000)
    assert node.stops == ["/shoal/unload", "/shoal/unload"]
    assert panel.headline.text() == "Stopped"


def test_a_refused_copies_launch_says_the_nodes_sentence(qtbot, node, panel):
    # the real node's words where too few machines hold a copy each (engine/node/replicas.py)
    node.launch_error = {"error": {
        "message": f"{MODEL} fits 3 copies on separate machines here, not 4: ask for 3, "
                   "or add machines.",
        "type": "server_error", "param": "replicas", "code": "insufficient_memory"}}
    panel.copies_spin.setValue(4)
    qtbot.mouseClick(panel.launch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.state_text == "Failed", timeout=10000)
    assert node.launches[-1]["replicas"] == 4
    text = panel.headline.text()
    assert text.startswith("Launching 4 copies failed") and "ask for 3" in text, text
    assert not panel.force_button.isVisible()  # forcing wouldn't make room for a copy
    assert panel.launch_button.isEnabled()  # the user can ask for fewer


def test_the_panel_asks_only_while_on_screen_and_at_once_when_back(qtbot, node, panel):
    qtbot.waitUntil(lambda: len(panel.replicas._rows) == 2, timeout=5000)
    panel.hide()  # another tab shown: the node isn't asked
    asked = node.asked
    qtbot.wait(int(2.5 * 1000))  # more than the view's 2 s
    assert node.asked == asked
    node.replicas = ONE_COPY
    panel.replicas._timer.setInterval(60_000)  # no tick comes in time: only showing asks
    panel.show()  # back: asked at once, not after the next 2 s, so nothing old stays
    qtbot.waitUntil(lambda: not panel.replicas.isVisible(), timeout=1000)
    assert node.asked == asked + 1


def shown_whole(w, window) -> bool:
    rect = QRect(w.mapTo(window, QPoint(0, 0)), w.size())
    return (w.isVisible() and w.visibleRegion().boundingRect() == w.rect()
            and window.rect().contains(rect))


def test_the_copies_fit_a_laptop_window_in_light_and_dark(qtbot, node, tmp_path):
    """The app's window at 1366x768 with the Placement tab: every copy's row is on screen
    whole, in light and in dark. SHOAL_SHOTS=folder keeps the pictures to look at."""
    from app.main import ShoalApp
    home = tmp_path / "home"
    home.mkdir()
    shoal = ShoalApp(home, node.port, tray_available=False)  # its node: the stand-in
    qtbot.addWidget(shoal.window)
    try:
        shoal._build_views()
        shoal._started()
        shoal.state.set_topology(topology())
        win = shoal.window
        win.show()
        win.show_view("Placement")
        win.resize(1366, 768)
        launch, view = shoal.placement.launch, shoal.placement.launch.replicas
        # three copies launched from the panel, each on a machine, all of them busy
        node.replicas = {"replicas": [replica(n, share=s, routed=r, running=4, waiting=w)
                                      for n, s, r, w in (("aaaa", 0.34, 34, 3),
                                                         ("bbbb", 0.33, 33, 0),
                                                         ("cccc", 0.33, 33, 1))]}
        qtbot.waitUntil(lambda: shoal.placement.node_list.count() == 3, timeout=5000)
        launch.set_placement(MODEL, "pipeline", "ring", [("aaaa", (0, 32))])
        launch.copies_spin.setValue(3)
        qtbot.mouseClick(launch.launch_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: launch.state_text == "Ready", timeout=10000)
        qtbot.waitUntil(lambda: len(view._rows) == 3, timeout=10000)
        out = Path(os.environ.get("SHOAL_SHOTS") or tmp_path)
        for mode in ("light", "dark"):
            win.appearance_actions[mode].trigger()
            shown = [*(w for r in view._rows.values() for w in r.widgets()),
                     *launch.rows.values(), launch.headline]
            qtbot.waitUntil(lambda: all(shown_whole(w, win) for w in shown),  # noqa: B023
                            timeout=5000)
            assert win.size().width() == 1366 and win.size().height() == 768
            assert win.grab().save(str(out / f"replicas-{mode}.png"))
    finally:
        shoal.appearance.set_mode("light")  # the next test starts as the default does
        shoal.shutdown()


def test_two_real_nodes_run_copies_and_the_view_shows_their_share(qtbot, tmp_path,
                                                                    tiny_model_dir):
    """The same against the real node (two `shoal node` processes on loopback with the
    tiny model): Copies 2 runs one copy on each machine, the view shows both under the
    model, and a request sent to the app's node shows in their shares."""
    import httpx
    from test_launch_anyway import follow, unfollow

    from nodes import start_cluster

    for i, name in enumerate(("mac-a", "mac-b")):
        home = tmp_path / f"node{i}" / "home"
        home.mkdir(parents=True)
        (home / "node.json").write_text(json.dumps({"id": f"{name}-id", "name": name}))
    a, b = start_cluster(tmp_path, tiny_model_dir, 2)
    tasks, state, monitor = follow(a)
    try:
        qtbot.waitUntil(lambda: len(state.cards()) == 2, timeout=20000)
        panel = LaunchPanel(a.client, tasks, state)
        qtbot.addWidget(panel)
        panel.resize(1000, 400)
        panel.show()
        panel.set_placement("tiny-llama", "pipeline", "ring", [("mac-a-id", (0, 4))])
        panel.copies_spin.setValue(2)
        qtbot.mouseClick(panel.launch_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state_text in ("Ready", "Failed"), timeout=120000)
        text = panel.headline.text()
        assert panel.state_text == "Ready", text
        assert text.startswith("Ready: 2 copies of tiny-llama run: one on mac-")
        assert "one on mac-a" in text and "one on mac-b" in text
        view = panel.replicas
        qtbot.waitUntil(lambda: len(view._rows) == 2, timeout=30000)
        assert texts(view)[0] == ["tiny-llama: 2 copies"]
        assert [t[0] for t in texts(view)[1:]] == ["mac-a (this machine)", "mac-b"]
        assert all(t[3] == "no requests yet" for t in texts(view)[1:])

        r = httpx.post(a.url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny-llama", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        qtbot.waitUntil(lambda: sorted(t[3] for t in texts(view)[1:]) == [
            "0% of requests", "100% of requests"], timeout=10000)

        # Stop unloads the copy here; mac-b's goes on, so one copy is left: no view
        qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state_text == "Stopped", timeout=30000)
        assert "not the copies on mac-b" in panel.headline.text()
        qtbot.waitUntil(lambda: not view.isVisible(), timeout=20000)
        assert b.client.status().model == "tiny-llama"
    finally:
        unfollow(a, tasks, state, monitor)
        b.stop()


def test_stop_on_the_other_machines_row_stops_that_copy_and_this_one_answers(
        qtbot, tmp_path, tiny_model_dir):
    """Two real nodes, one copy each: Stop on mac-b's row in mac-a's app stops mac-b's
    copy (mac-a passes it on over the cluster's channel), and mac-a's answers on, asked
    at either node; mac-b doesn't load it again for them."""
    import httpx

    from nodes import start_cluster

    for i, name in enumerate(("mac-a", "mac-b")):
        home = tmp_path / f"node{i}" / "home"
        home.mkdir(parents=True)
        (home / "node.json").write_text(json.dumps({"id": f"{name}-id", "name": name}))
    a, b = start_cluster(tmp_path, tiny_model_dir, 2)
    tasks = Tasks(max_threads=4)
    view = ReplicasView(a.client, tasks, {"mac-a-id": "mac-a", "mac-b-id": "mac-b"}.get,
                        interval=0.3)
    qtbot.addWidget(view)
    try:
        launched = a.client.launch("tiny-llama", "pipeline", [], timeout=120, replicas=2)
        assert isinstance(launched, LaunchedReplicas) and len(launched.instances) == 2
        view.start()
        qtbot.waitUntil(lambda: len(view._rows) == 2, timeout=30000)
        assert [t[0] for t in texts(view)[1:]] == ["mac-a (this machine)", "mac-b"]
        qtbot.mouseClick(view._rows[("tiny-llama", "mac-b-id")].stop,
                         Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not view.isVisible(), timeout=20000)
        assert not view.stop_label.isVisible(), view.stop_label.text()
        assert b.client.status().worker_pid is None
        for n in (a, b, a, b):
            r = httpx.post(n.url + "/v1/chat/completions", timeout=120, json={
                "model": "tiny-llama", "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
        assert b.client.status().worker_pid is None
        assert a.client.status().model == "tiny-llama"
    finally:
        view.stop()
        tasks.wait(20000)
        a.stop()
        b.stop()
