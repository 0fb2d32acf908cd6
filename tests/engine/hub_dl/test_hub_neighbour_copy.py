"""Two real node processes: one has a model in its Hugging Face cache, the other pulls it
through the API and gets every byte from its neighbour (signed with the cluster secret,
verified by hash), falling back to the Hub for what the neighbour lacks."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hub_models import BIG, SHARDED

from engine.hub.download import pull, repo_dir
from engine.records import DownloadInfo
from members import Member
from nodes import NodeProcess, free_port
from tests_support import wait_until

ROOT = Path(__file__).resolve().parents[3]
SECRET = "hub-test-secret"


@pytest.fixture
def two_nodes(hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
              ) -> Iterator[tuple[list[NodeProcess], list[Path]]]:
    caches = [tmp_path / "cache0", tmp_path / "cache1"]
    pull(SHARDED, cache_dir=caches[0])  # node0 has the model already
    hub.reset_counters()
    ports = [free_port(), free_port()]
    nodes: list[NodeProcess] = []
    try:
        for i, cache in enumerate(caches):
            monkeypatch.setenv("HF_HUB_CACHE", str(cache))
            nodes.append(NodeProcess(tmp_path / f"node{i}", "none", "--peer",
                                     f"127.0.0.1:{ports[1 - i]}", "--secret", SECRET,
                                     cluster_port=ports[i]))
        for n in nodes:
            n.wait_healthy()
        wait_until(lambda: all(p["trusted"] for p in
                               nodes[1].client._call("GET", "/shoal/peers")), 20)
        yield nodes, caches
    finally:
        for n in nodes:
            n.stop()


def _pull(node: NodeProcess, repo: str) -> DownloadInfo:
    d = node.client.hub_pull(repo)
    def done() -> bool:
        nonlocal d
        d = next(x for x in node.client.hub_downloads() if x.id == d.id)
        return d.state != "running"
    wait_until(done, 30)
    assert d.state == "done", (d, node.tail())
    return d


def test_a_node_copies_a_model_from_its_neighbour(hub, two_nodes) -> None:
    nodes, caches = two_nodes
    d = _pull(nodes[1], SHARDED)
    assert {f.source for f in d.progress.files} == {f"peer {n}" for n in _names(nodes[1])}
    assert hub.served() == 0  # the Hub was asked for the file list, not for a byte
    snap = Path(d.path)
    assert snap.parent.parent == repo_dir(caches[1], SHARDED)
    for path, f in hub.repos[SHARDED].files.items():
        assert (snap / path).is_symlink()
        assert hashlib.sha256((snap / path).read_bytes()).hexdigest() == f.sha256
    # what the neighbour doesn't have comes from the Hub
    d = _pull(nodes[1], BIG)
    assert {f.source for f in d.progress.files} == {"hub"}
    assert hub.served(BIG) == sum(f.size for f in hub.repos[BIG].files.values())
    # and the model can be removed again through the API
    r = nodes[1].client._call("DELETE", f"/shoal/models/{SHARDED}")
    assert r["deleted"] == SHARDED and not repo_dir(caches[1], SHARDED).exists()
    # with the internet gone, the neighbour's file list and files are enough
    hub.stop()
    d = _pull(nodes[1], SHARDED)
    assert all(f.source.startswith("peer ") for f in d.progress.files)
    assert (repo_dir(caches[1], SHARDED) / "refs" / "main").read_text() == \
        hub.repos[SHARDED].commit


def test_the_peer_file_routes_need_the_cluster_secret_and_answer_ranges(hub, two_nodes
                                                                        ) -> None:
    nodes, _ = two_nodes
    commit = hub.repos[SHARDED].commit
    path = f"/shoal/peer/files/{SHARDED}/{commit}/config.json"
    with httpx.Client(base_url=nodes[0].url) as c:  # the user API never serves them
        assert c.get(path).status_code == 401
        assert c.get("/shoal/peer/files-index").status_code == 401
    with Member(nodes[0].cluster_url, SECRET) as m:
        r = m.send("GET", path, headers={**m.signed("GET", path), "Range": "bytes=10-"})
        data = hub.repos[SHARDED].files["config.json"].source.read_bytes()
        assert r.status_code == 206 and r.content == data[10:]
        bad = f"/shoal/peer/files/{SHARDED}/{commit}/..%2F..%2Frefs%2Fmain"
        assert m.send("GET", bad).status_code in (400, 404)
        listed = m.call("GET", "/shoal/peer/files-index").json()
    assert listed[0]["repo"] == SHARDED and listed[0]["revision"] == commit
    assert {f["path"] for f in listed[0]["files"]} == set(hub.repos[SHARDED].files)


def _names(node: NodeProcess) -> list[str]:
    return [p["name"] or p["url"] for p in node.client._call("GET", "/shoal/peers")]


def test_downloads_through_the_api_show_progress_and_cancel(hub, two_nodes) -> None:
    nodes, _ = two_nodes
    node = nodes[1]
    hub.rate_bps = 1e6
    d = node.client.hub_pull(BIG)
    again = node.client.hub_pull(BIG)
    assert again.id == d.id  # the same download, not a second one

    def moving() -> bool:
        p = node.client.hub_downloads()[-1].progress
        return bool(p and p.done > 100_000 and p.speed_Bps > 0)
    wait_until(moving, 20)
    node.client.hub_cancel(d.id)
    wait_until(lambda: node.client.hub_downloads()[-1].state == "cancelled", 5)
    found = node.client._call("GET", "/shoal/hub/search", params={"q": "tiny"})
    assert BIG in [m["id"] for m in found["models"]] and found["hub_error"] is None
    held = next(m for m in found["models"] if m["id"] == SHARDED)["local"]
    assert [w["source"] for w in held] == ["peer"]  # node0 has it: a copy is near
    catalog = node.client._call("GET", "/shoal/hub/catalog")["models"]
    assert any(m["id"].startswith("mlx-community/") for m in catalog)
    from engine.errors import BadRequest, ModelNotFound
    with pytest.raises(BadRequest):
        node.client._call("POST", "/shoal/hub/pull", json={"repo": BIG, "layers": [3, 1]})
    node.client.hub_pull("test-org/nope")
    wait_until(lambda: node.client.hub_downloads()[-1].state == "failed", 10)
    err = node.client.hub_downloads()[-1].error
    assert err.code == ModelNotFound.code and "Check the name" in err.message


def test_a_peers_malformed_index_entries_are_skipped_not_fatal():
    """A peer's files-index is input from another machine: entries that aren't whole
    (a missing field, files that aren't objects, a size that isn't a count) are left out,
    and an answer that isn't a list is no index."""
    from engine.hub.neighbour import read_index

    good = {"repo": "a/b", "revision": "c", "refs": ["main"],
            "files": [{"path": "x", "size": 3, "etag": "e"}]}
    bad = [{"repo": "a/b"}, {"repo": "a/b", "revision": "c", "files": ["x"]},
           {"repo": "a/b", "revision": "c", "files": [{"path": "x", "size": "3", "etag": "e"}]},
           {"repo": "a/b", "revision": "c", "files": [{"path": "x", "size": -1, "etag": "e"}]},
           5, None]
    assert [r.to_json() for r in read_index([*bad, good])] == [
        {**good, "files": [{**good["files"][0], "sha256": None}]}]
    assert read_index({"repo": "a/b"}) == [] and read_index(None) == []
