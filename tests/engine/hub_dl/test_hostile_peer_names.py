"""Names from a neighbour, both ways. Fetching: with the Hub unreachable a pull takes its
file plan from a peer's files-index, and a hostile peer chooses the paths, the commit and
the etags (so the hash check passes): the plan is refused as a whole, naming the peer and
the name, before anything is written. Serving: a node lists and serves only names that
pass the same rule, whatever its cache holds.

The peer here is a stand-in `peers` object whose `call` returns the hostile index and
whose `stream` serves bytes, as Peers does once the answer is authenticated; a real hostile
peer process over the cluster's TLS is tested by the node-to-node tests (tests/cluster/,
tests/hostile_peer.py) once that authentication lands."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hub_models import SHARDED

from engine.errors import BadRequest
from engine.hub.download import pull, repo_dir
from engine.hub.errors import UnsafeName
from engine.hub.names import shown
from engine.hub.neighbour import NeighbourSource, cache_index, cached_file

PEER = "https://10.0.0.66:7070"
COMMIT = "c" * 40
PAYLOAD = b"import os; os.system('echo pwned')\n"
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class StandInPeers:
    """One trusted, reachable peer named "stranger" that answers files-index with `index`
    and any file with PAYLOAD; it records what it was asked."""

    def __init__(self, index: Any):
        self.index = index
        self.asked: list[str] = []

    def all(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(url=PEER, name="stranger", trusted=True, reachable=True,
                                link=SimpleNamespace(bandwidth_MBps=1000.0))]

    async def call(self, url: str, method: str, path: str, **kw: Any) -> Any:
        self.asked.append(path)
        return self.index

    @asynccontextmanager
    async def stream(self, url: str, method: str, path: str,
                     **kw: Any) -> AsyncIterator[SimpleNamespace]:
        self.asked.append(path)

        async def chunks(n: int) -> AsyncIterator[bytes]:
            yield PAYLOAD
        yield SimpleNamespace(status=200, content=SimpleNamespace(iter_chunked=chunks))


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The node's event loop, which NeighbourSource runs the peers' requests on."""
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)
    loop.close()


def _index(files: list[dict[str, Any]], revision: str = COMMIT) -> list[dict[str, Any]]:
    return [{"repo": SHARDED, "revision": revision, "refs": ["main"], "files": files}]


def _file(path: str, etag: str = SHA, size: int = len(PAYLOAD)) -> dict[str, Any]:
    return {"path": path, "size": size, "etag": etag}


HOSTILE = {  # (what the index lists, the name the refusal must show)
    "dot-dot": (_index([_file("../../../../site-packages/sitecustomize.py")]),
                "../../../../site-packages/sitecustomize.py"),
    "absolute": (_index([_file("/usr/lib/python3/sitecustomize.py")]),
                 "/usr/lib/python3/sitecustomize.py"),
    "backslash": (_index([_file("..\\..\\sitecustomize.py")]), "..\\..\\sitecustomize.py"),
    "drive": (_index([_file("C:/Python/sitecustomize.py")]), "C:/Python/sitecustomize.py"),
    "empty segment": (_index([_file("a//config.json")]), "a//config.json"),
    "nul": (_index([_file("config.json\x00.py")]), "config.json\x00.py"),
    "too long": (_index([_file("x" * 300 + ".json")]), "x" * 300 + ".json"),
    "etag walks out": (_index([_file("config.json", "../../../../tmp/shoal-etag")]),
                       "../../../../tmp/shoal-etag"),
    "etag not a hash": (_index([_file("config.json", "e")]), "e"),
    "commit walks out": (_index([_file("config.json")], "../main"), "../main"),
    "commit not hex": (_index([_file("config.json")], "z" * 40), "z" * 40),
    "file and folder": (_index([_file("a.json"), _file("a.json/b.json")]), "a.json"),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_plan_is_refused_whole_naming_the_peer_and_the_name(
        loop: asyncio.AbstractEventLoop, kind: str) -> None:
    index, name = HOSTILE[kind]
    good = [_file("config.json"), _file("model.safetensors")]
    index[0]["files"] = good + [f for f in index[0]["files"] if f not in good]
    with pytest.raises(UnsafeName) as e:
        NeighbourSource(StandInPeers(index), loop).plan(SHARDED, "main")
    assert e.value.message.startswith(f"Peer stranger ({PEER}) listed ")
    assert shown(name) in e.value.message and "Nothing was written" in e.value.message
    assert "cluster secret" in e.value.message


def test_an_honest_plan_is_taken_and_its_files_fetched(loop: asyncio.AbstractEventLoop,
                                                       tmp_path: Path) -> None:
    peers = StandInPeers(_index([_file("config.json")]))
    source = NeighbourSource(peers, loop)
    plan = source.plan(SHARDED, "main")
    assert plan is not None and plan.commit == COMMIT
    assert [(f.path, f.etag) for f in plan.files] == [("config.json", SHA)]
    dest = tmp_path / "part"
    got = source.fetch(SHARDED, COMMIT, plan.files[0], dest, lambda n: None,
                       threading.Event())
    assert got == "peer stranger" and dest.read_bytes() == PAYLOAD
    assert peers.asked[-1] == f"/shoal/peer/files/{SHARDED}/{COMMIT}/config.json"


@pytest.mark.parametrize("kind", ["dot-dot", "absolute", "etag walks out",
                                  "commit walks out"])
def test_with_the_hub_down_a_hostile_peer_fails_the_pull_and_nothing_is_written(
        hub, hf_env: Path, tmp_path: Path, loop: asyncio.AbstractEventLoop,
        kind: str) -> None:
    """The attack as it ran: the Hub unreachable, the neighbour's plan used, its names
    joined under snapshots/ and blobs/. Now the pull fails before a byte is fetched."""
    hub.down = True
    index, name = HOSTILE[kind]
    if kind == "absolute":  # somewhere this test may look at
        name = str(tmp_path / "site-packages" / "sitecustomize.py")
        index = _index([_file(name)])
    peers = StandInPeers(index)
    before = {os.path.join(d, n) for d, ds, fs in os.walk(tmp_path) for n in ds + fs}
    with pytest.raises(UnsafeName) as e:
        pull(SHARDED, sources=[NeighbourSource(peers, loop)])
    assert f"Peer stranger ({PEER})" in e.value.message and shown(name) in e.value.message
    assert {os.path.join(d, n) for d, ds, fs in os.walk(tmp_path) for n in ds + fs} == before
    assert not any(p.startswith("/shoal/peer/files/") for p in peers.asked)


# --- serving side -------------------------------------------------------------------------
@pytest.fixture
def odd_cache(hub, hf_env: Path, tmp_path: Path) -> tuple[Path, str]:
    """A real pulled model, plus what a tampered cache could hold: a ref holding a path, a
    snapshot folder that isn't a commit, links with names no Hub gives, a blob that isn't
    named by a hash, a link leading out of blobs/."""
    snap = pull(SHARDED)
    repo, commit = repo_dir(hf_env, SHARDED), snap.name
    (repo / "refs" / "evil").write_text("../../../../etc")
    (repo / "refs" / "pr").mkdir()
    (repo / "refs" / "pr" / "1").write_text(commit)
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (repo / "blobs" / "not-a-hash").write_text("{}")
    blob = os.readlink(snap / "config.json")
    for name, target in [("back\\slash.json", blob), ("new\nline.json", blob),
                         ("odd.json", "../../blobs/not-a-hash"), ("out.json", str(secret))]:
        (snap / name).symlink_to(target)
    other = repo / "snapshots" / "not-a-commit"
    other.mkdir()
    (other / "config.json").symlink_to("../../blobs/" + Path(blob).name)
    return hf_env, commit


def test_the_index_lists_only_names_a_pull_would_take(hub, odd_cache: tuple[Path, str]
                                                      ) -> None:
    cache, commit = odd_cache
    [rev] = cache_index(cache)
    assert rev.revision == commit and sorted(rev.refs) == ["main", "pr/1"]
    assert {f.path for f in rev.files} == set(hub.repos[SHARDED].files)
    assert cache_index(cache, SHARDED) == [rev]
    with pytest.raises(BadRequest):
        cache_index(cache, "../../etc")


@pytest.mark.parametrize("revision,path", [
    ("main", "../../refs/main"), ("main", "/etc/passwd"), ("main", "back\\slash.json"),
    ("main", "new\nline.json"), ("main", "odd.json"), ("main", "out.json"),
    ("main", "config.json/"), ("main", "x" * 100_000), ("evil", "config.json"),
    ("not-a-commit", "config.json"), ("../main", "config.json"), ("", "config.json"),
    ("main\x00", "config.json")])
def test_a_file_is_served_only_by_a_name_that_passes(odd_cache: tuple[Path, str],
                                                     revision: str, path: str) -> None:
    cache, commit = odd_cache
    assert cached_file(cache, SHARDED, revision, path) is None


def test_the_names_that_pass_are_served(odd_cache: tuple[Path, str]) -> None:
    cache, commit = odd_cache
    for revision in ("main", "pr/1", commit):
        blob = cached_file(cache, SHARDED, revision, "config.json")
        assert blob is not None and blob.parent.name == "blobs"
    for repo in ("../x", "a/b/c", "o/" + "n" * 100_000):
        assert cached_file(cache, repo, "main", "config.json") is None
