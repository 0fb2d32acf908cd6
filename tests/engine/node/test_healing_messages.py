"""What healing says, rule by rule, over a stand-in cluster (the real walk is in
tests/cluster/test_healing*.py): the lost machine by name, whether it left or stopped
answering, where the model goes and about how long that takes, what is missing where
nothing fits, and the user's own split (tensor, lanes and all) kept to offer back. No
sentence holds a node id, a rank or an API route."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.errors import InsufficientMemory, PeerUnreachable
from engine.node import healing
from engine.node.followers import LEAVING
from engine.node.healing import Healer, estimate_s
from engine.node.launch import Instance, Rank
from engine.records import InstanceInfo, InstanceState, RankInfo

NAMES = {"id-a": "mac-a", "id-b": "mac-b", "id-c": "mac-c"}


@dataclass
class Peer:
    id: str
    url: str
    name: str
    trusted: bool = True
    reachable: bool = True


@dataclass
class Peers:
    answers: dict[str, str]  # node id: "up", "leaving" or "down"

    def find(self, ref: str) -> Peer | None:
        nid = next((n for n in NAMES if ref in (n, f"https://{n}")), None)
        return Peer(nid, f"https://{nid}", NAMES[nid]) if nid and nid != "id-a" else None

    def all(self) -> list[Peer]:
        return [Peer(n, f"https://{n}", NAMES[n], reachable=self.answers[n] == "up")
                for n in NAMES if n != "id-a"]

    async def call(self, url: str, method: str, path: str, timeout: float = 10) -> Any:
        how = self.answers[url.removeprefix("https://")]
        if how == "down":
            raise PeerUnreachable("no answer")
        return {"id": url, "followers": [{"reason": LEAVING}] if how == "leaving" else []}


@dataclass
class Cluster:
    answers: dict[str, str]
    fits: bool = True
    id: str = "id-a"
    name: str = "mac-a"
    instance: Instance | None = None
    launched: list[dict[str, Any]] = field(default_factory=list)
    said: list[str] = field(default_factory=list)  # the healer's message as it launched
    healer: Any = None

    def __post_init__(self) -> None:
        self.peers = Peers(self.answers)

    def name_of(self, nid: str) -> str:
        return NAMES[nid]

    async def launch(self, raw: dict[str, Any], exclude: frozenset[str] = frozenset(),
                     healing: bool = False) -> InstanceInfo:
        self.launched.append({**raw, "exclude": sorted(exclude)})
        self.said.append(self.healer.info.message)
        if not self.fits:
            raise InsufficientMemory("tiny-llama fits no placement on this cluster: mac-a "
                                     "needs 3.1 GB more")
        left = [n for n in NAMES if n not in exclude]
        return InstanceInfo("new", raw["model"], "pipeline", InstanceState.READY, None,
                            [RankInfo(i, n) for i, n in enumerate(left)])


def instance(strategy: str = "pipeline", lanes: int = 1, backend: str = "ring") -> Instance:
    layers = [(0, 2), (2, 3), (3, 4)] if strategy == "pipeline" else [None] * 3
    return Instance("old", "tiny-llama", strategy,
                    [Rank(n, None if n == "id-a" else f"https://{n}", r)
                     for n, r in zip(NAMES, layers)],
                    backend=backend, lanes=lanes, load_s=6.0)


def heal(cluster: Cluster, inst: Instance, reason: str = "mac-c stopped answering",
         enabled: bool = True) -> Healer:
    async def run() -> Healer:
        h = cluster.healer = Healer(cluster, enabled)  # type: ignore[arg-type]
        h.start(inst, reason)
        for _ in range(200):  # until placed (or not); then it only looks for the lost
            if h.info is not None and h.info.state != "placing":
                break
            await asyncio.sleep(0.01)
        await h.close()
        return h

    return asyncio.run(run())


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(healing, "BACK_EVERY_S", 0.01)


def plain(text: str) -> str:
    assert not any(n in text for n in NAMES) and "rank" not in text and "/shoal" not in text
    return text


def test_a_killed_machine_is_named_and_the_model_runs_again_on_the_rest():
    c = Cluster({"id-b": "up", "id-c": "down"})
    c.peers.answers["id-c"] = "down"

    async def back_later() -> None:  # mac-c returns once the model runs again
        await asyncio.sleep(0.05)
        c.peers.answers["id-c"] = "up"

    async def run() -> Healer:
        h = c.healer = Healer(c)  # type: ignore[arg-type]
        h.start(instance(), "mac-c stopped answering")
        assert h.info is not None and h.info.state == "placing"
        asyncio.create_task(back_later())
        assert h._task is not None
        await asyncio.wait_for(h._task, 2)
        return h
    h = asyncio.run(run())
    info = h.info
    assert info is not None and info.state == "serving" and info.back
    assert c.launched == [{"model": "tiny-llama", "kv_bits": 16, "exclude": ["id-c"]}]
    assert info.lost == ["id-c"] and info.lost_names == ["mac-c"] and not info.left
    assert info.on_names == ["mac-a", "mac-b"] and info.estimate_s == estimate_s(
        instance(), 2)
    assert plain(info.message) == "mac-c is back: use your own split to run tiny-llama " \
                                  "as before."
    assert info.original["nodes"] == [{"node": "id-a", "layers": [0, 2]},
                                      {"node": "id-b", "layers": [2, 3]},
                                      {"node": "id-c", "layers": [3, 4]}]


def test_while_it_places_the_message_says_where_and_about_how_long():
    c = Cluster({"id-b": "up", "id-c": "down"})
    h = heal(c, instance())
    about = estimate_s(instance(), 2)
    assert plain(c.said[0]) == (f"tiny-llama stopped: mac-c stopped answering. Placing it "
                                f"again on mac-a and mac-b, about {about:.0f} s.")
    assert h.info is not None and h.info.state == "serving"
    assert plain(h.info.message).startswith("tiny-llama is running again without mac-c, on "
                                            "mac-a and mac-b (")


def test_a_machine_that_quits_left_and_is_never_planned_on():
    c = Cluster({"id-b": "leaving", "id-c": "up"})
    info = heal(c, instance(), "mac-b is shutting down").info
    assert info is not None and info.left and info.lost_names == ["mac-b"]
    assert c.launched[0]["exclude"] == ["id-b"]
    assert plain(info.message).startswith("tiny-llama is running again without mac-b, on "
                                          "mac-a and mac-c")
    assert info.detail == "mac-b is shutting down"  # the nodes' words, one click away


def test_where_nothing_fits_it_says_what_to_do():
    c = Cluster({"id-b": "up", "id-c": "down"}, fits=False)
    info = heal(c, instance()).info
    assert info is not None and info.state == "doesnt_fit"
    assert plain(info.message) == (
        "tiny-llama stopped: mac-c stopped answering. It doesn't fit on mac-a and mac-b "
        "without mac-c, so it stays stopped. Free memory there, or bring mac-c back and use your "
        "own split again.")
    assert "3.1 GB" in info.detail


def test_tensor_with_lanes_is_planned_afresh_and_kept_to_offer_back():
    c = Cluster({"id-b": "down", "id-c": "up"})
    info = heal(c, instance("tensor", lanes=2)).info
    assert info is not None and info.state == "serving"
    assert c.launched[0] == {"model": "tiny-llama", "kv_bits": 16, "exclude": ["id-b"]}
    assert info.original["strategy"] == "tensor" and info.original["lanes"] == 2
    assert all("layers" not in n for n in info.original["nodes"])


def test_a_broken_rdma_group_with_every_machine_there_runs_over_tcp():
    c = Cluster({"id-b": "up", "id-c": "up"})
    info = heal(c, instance(backend="jaccl"), "the group lost step").info
    assert info is not None and info.state == "serving" and info.lost == []
    assert c.launched[0]["backend"] == "ring" and c.launched[0]["nodes"][2]["layers"] == [3, 4]
    assert "same machines, over the network (TCP)" in plain(info.message)


def test_healing_off_says_to_launch_again_and_the_hint_names_no_route():
    c = Cluster({"id-b": "up", "id-c": "down"})
    h = heal(c, instance(), enabled=False)
    assert h.info is not None and h.info.state == "off" and "Launch it again" in h.info.message
    assert h.hint("tiny-llama") is None
    c.instance = instance()
    hint = Healer(c).hint("tiny-llama")  # type: ignore[arg-type]
    assert hint is not None and "/shoal" not in hint and "about" in hint
