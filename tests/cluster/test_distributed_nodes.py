"""One model across several real node processes on 127.0.0.1: launching through any node's
API, serving through any node, invalid placements refused before anything starts, and a
rank that dies taking the whole instance down with the reason."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.errors import ShoalError
from nodes import NodeProcess, start_cluster, worker_pids
from tests_support import wait_until

HELLO = [{"role": "user", "content": "Hello from the cluster"}]


@pytest.fixture(scope="module")
def trio(tmp_path_factory, tiny_model_dir) -> list[NodeProcess]:
    nodes = start_cluster(tmp_path_factory.mktemp("trio"), tiny_model_dir, 3)
    yield nodes
    for n in nodes:
        n.stop()


def node_id(n: NodeProcess) -> str:
    return n.client.status().cluster.id


def launch(via: NodeProcess, body: dict) -> httpx.Response:
    return httpx.post(via.url + "/shoal/instances", json=body, timeout=300)


def greedy(n: NodeProcess, tokens: int = 24) -> str:
    r = n.client.complete(HELLO, model="tiny-llama", max_tokens=tokens, temperature=0)
    return r["choices"][0]["message"]["content"]


@pytest.mark.parametrize("nodes,words", [
    ([{"node": "self", "layers": [0, 3]}, {"node": "B", "layers": [2, 4]}], "overlaps"),
    ([{"node": "self", "layers": [0, 2]}, {"node": "B", "layers": [3, 4]}],
     "leaves layers 2-2"),
    ([{"node": "self", "layers": [0, 2]}, {"node": "B", "layers": [2, 3]}], "layers 3-3"),
    ([{"node": "self", "layers": [0, 2]}, {"node": "nowhere:1", "layers": [2, 4]}],
     "no reachable node"),
])
def test_invalid_pipeline_placements_are_refused(trio, nodes, words):
    a, b, _ = trio
    for n in nodes:
        if n["node"] == "B":
            n["node"] = node_id(b)
    r = launch(a, {"model": "tiny-llama", "strategy": "pipeline", "nodes": nodes})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
    assert a.client.status().worker_pid is None  # nothing was started


def test_tensor_parallel_needs_divisible_heads(trio):
    r = launch(trio[0], {"model": "tiny-llama", "strategy": "tensor",
                         "nodes": [{"node": "self"}, {"node": node_id(trio[1])},
                                   {"node": node_id(trio[2])}]})
    assert r.status_code == 400
    assert "don't divide by 3 ranks" in r.json()["error"]["message"]


def test_model_missing_on_a_node_is_named(trio, tmp_path):
    r = launch(trio[0], {"model": "not-here", "strategy": "pipeline",
                         "nodes": [{"node": "self", "layers": [0, 2]},
                                   {"node": node_id(trio[1]), "layers": [2, 4]}]})
    assert r.status_code == 404
    assert "not-here" in r.json()["error"]["message"]


@pytest.mark.parametrize("strategy,lanes,words", [
    ("pipeline", 0, "from 1 to 2"), ("pipeline", 3, "from 1 to 2"),
    ("pipeline", "2", "whole number"), ("pipeline", True, "whole number"),
    ("tensor", 2, "from 1 to 1")])
def test_bad_lanes_are_refused_before_anything_starts(trio, strategy, lanes, words):
    a, b, _ = trio
    nodes = [{"node": "self", "layers": [0, 2]}, {"node": node_id(b), "layers": [2, 4]}] \
        if strategy == "pipeline" else [{"node": "self"}, {"node": node_id(b)}]
    r = launch(a, {"model": "tiny-llama", "strategy": strategy, "nodes": nodes,
                   "lanes": lanes})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "lanes" and words in message
    assert f"not {lanes!r}" in message
    assert a.client.status().worker_pid is None  # nothing was started


def test_lanes_need_a_node_that_batches(tmp_path, tiny_model_dir):
    """With --max-streams 1 the group runs one request at a time: asking for lanes is
    refused with the reason, and without asking the instance has one."""
    a, b = start_cluster(tmp_path, tiny_model_dir, 2, extra=("--max-streams", "1"))
    try:
        nodes = [{"node": "self", "layers": [0, 2]}, {"node": node_id(b), "layers": [2, 4]}]
        r = launch(a, {"model": "tiny-llama", "strategy": "pipeline", "nodes": nodes,
                       "lanes": 2})
        assert r.status_code == 400, r.text
        assert "--max-streams 1" in r.json()["error"]["message"]
        r = launch(a, {"model": "tiny-llama", "strategy": "pipeline", "nodes": nodes})
        assert r.status_code == 201, r.text
        assert r.json()["lanes"] == 1
    finally:
        a.stop()
        b.stop()


def test_pipeline_over_three_nodes_serves_through_any_node(trio, tiny_node):
    """Launched from any node, served through any node; with a lane per rank, concurrent
    requests each get the one-process answer."""
    expected = greedy(tiny_node)  # the single-process answer
    a, b, c = trio
    r = launch(b, {"model": "tiny-llama", "strategy": "pipeline", "lanes": 3,
                   "nodes": [{"node": node_id(a), "layers": [0, 1]},
                             {"node": node_id(b), "layers": [1, 3]},
                             {"node": node_id(c), "layers": [3, 4]}]})
    assert r.status_code == 201, r.text
    inst = r.json()
    assert inst["state"] == "ready" and [x["layers"] for x in inst["ranks"]] == \
        [[0, 1], [1, 3], [3, 4]]
    assert inst["lanes"] == 3
    assert greedy(a) == expected  # a owns rank 0
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda n: greedy(n), [a, a, b, c])) == [expected] * 4
    wait_until(lambda: any(m.id == "tiny-llama" for m in c.client.models()), 10)
    assert greedy(c) == expected  # c relays to the owner
    stream = c.client.chat(HELLO, model="tiny-llama", max_tokens=24, temperature=0)
    assert "".join(d.text for d in stream) == expected
    assert httpx.delete(a.url + f"/shoal/instances/{inst['id']}", timeout=60).is_success
    # alone the followers stop within a few seconds; a loaded whole run took past 15
    wait_until(lambda: all(n.client.status().cluster.followers == [] or
                           all(f.state == "stopped" for f in
                               n.client.status().cluster.followers) for n in trio), 40)


def test_a_dead_rank_fails_the_instance_and_launching_again_works(tmp_path, tiny_model_dir):
    # healing off: what a user who turned it off sees (test_healing.py has it on)
    a, b = start_cluster(tmp_path, tiny_model_dir, 2, extra=("--no-heal",))
    try:
        body = {"model": "tiny-llama", "strategy": "pipeline",
                "nodes": [{"node": "self", "layers": [0, 2]},
                          {"node": node_id(b), "layers": [2, 4]}]}
        assert launch(a, body).status_code == 201
        follower = b.client.status().cluster.followers[0]
        assert follower.state == "ready"
        b_worker = worker_pids(b)
        assert b_worker
        stream = a.client.chat(HELLO, model="tiny-llama", max_tokens=100_000, temperature=0)
        it = iter(stream)
        next(it)
        os.kill(b_worker[0], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ShoalError):
            for _ in it:
                pass
        assert time.monotonic() - t0 < 10
        wait_until(lambda: a.client.status().state == "error", 10)
        st = a.client.status()
        assert "rank" in st.error or "peer" in st.error
        assert st.cluster.instances[0].state == "failed"
        wait_until(lambda: not worker_pids(a) and not worker_pids(b), 10)
        # Asking again says the instance must be relaunched; relaunching works.
        with pytest.raises(ShoalError, match="Launch it again"):
            a.client.complete(HELLO, model="tiny-llama", max_tokens=2)
        assert launch(a, body).status_code == 201
        assert a.client.complete(HELLO, model="tiny-llama",
                                 max_tokens=3)["usage"]["completion_tokens"] == 3
    finally:
        a.stop()
        b.stop()


def test_a_vanished_node_is_noticed_within_ten_seconds(tmp_path, tiny_model_dir):
    a, b = start_cluster(tmp_path, tiny_model_dir, 2, extra=("--no-heal",))
    try:
        assert launch(a, {"model": "tiny-llama", "strategy": "pipeline",
                          "nodes": [{"node": "self", "layers": [0, 2]},
                                    {"node": node_id(b), "layers": [2, 4]}]}
                      ).status_code == 201
        os.killpg(b.proc.pid, signal.SIGKILL)  # the whole machine, as far as a knows
        t0 = time.monotonic()
        wait_until(lambda: a.client.status().state == "error", 10)
        assert time.monotonic() - t0 < 10
        assert not worker_pids(a)
    finally:
        a.stop()
        b.stop()


def test_memory_is_checked_before_launch_and_force_overrides(trio):
    a, b, _ = trio
    body = {"model": "tiny-llama", "strategy": "pipeline", "context": 2**31,
            "nodes": [{"node": "self", "layers": [0, 2]}, {"node": node_id(b), "layers": [2, 4]}]}
    r = launch(a, body)  # a KV cache for 2G tokens fits nowhere
    assert r.status_code == 507, r.text
    msg = r.json()["error"]["message"]
    assert "needs" in msg and "usable" in msg and "force" in msg
    assert a.client.status().worker_pid is None  # nothing was started
    forced = launch(a, {**body, "force": True})
    assert forced.status_code == 201, forced.text
    assert "forced beyond the memory check" in forced.json()["warning"]
    httpx.delete(a.url + f"/shoal/instances/{forced.json()['id']}", timeout=60)


def test_launch_without_nodes_takes_the_planners_best(trio):
    a = trio[0]
    r = launch(a, {"model": "tiny-llama"})
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "ready"
    assert a.client.complete(HELLO, model="tiny-llama", max_tokens=3)["usage"][
        "completion_tokens"] == 3


def test_rdma_backend_is_refused_with_the_reason_where_there_is_none(trio):
    a, b, _ = trio
    r = launch(a, {"model": "tiny-llama", "strategy": "pipeline", "backend": "jaccl",
                   "nodes": [{"node": "self", "layers": [0, 2]},
                             {"node": node_id(b), "layers": [2, 4]}]})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert msg.startswith("jaccl can't run on these nodes") and "ring backend" in msg


def test_each_rank_reports_its_loading_progress(trio):
    a, b, _ = trio
    r = launch(a, {"model": "tiny-llama", "strategy": "pipeline",
                   "nodes": [{"node": "self", "layers": [0, 3]},
                             {"node": node_id(b), "layers": [3, 4]}]})
    assert r.status_code == 201, r.text
    ranks = r.json()["ranks"]
    assert ranks[1]["progress"] == [1, 1]  # the follower's layers, all loaded
    follower = next(f for f in b.client.status().cluster.followers
                    if f.instance == r.json()["id"])
    assert follower.state == "ready" and follower.progress == [1, 1]


def test_a_follower_that_dies_while_the_group_forms_fails_the_launch_at_once(trio):
    """Rank 1's worker is killed as soon as it appears, before its doorbell answers: the
    launch fails within seconds, naming that rank's node, instead of rank 0 waiting the
    group's whole 120 s timeout for a neighbour that is gone."""
    a, b, _ = trio
    body = {"model": "tiny-llama", "strategy": "pipeline",
            "nodes": [{"node": "self", "layers": [0, 2]}, {"node": node_id(b), "layers": [2, 4]}]}
    before = set(worker_pids(b))  # an earlier test's rank may still be running there

    def new_rank() -> list[int]:
        return [p for p in worker_pids(b) if p not in before]

    with ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        pending = pool.submit(launch, a, body)
        wait_until(new_rank, 30, interval=0.02)
        os.kill(new_rank()[0], signal.SIGKILL)
        r = pending.result(timeout=60)
        took = time.monotonic() - t0
    print(f"\na follower killed while the group formed: the launch failed in {took:.1f} s: "
          f"{r.text[:300]}")
    assert r.status_code >= 500, r.text
    message = r.json()["error"]["message"]
    assert node_id(b) in message and "exited unexpectedly" in message, r.text
    assert message.count("rank 1") == 1, message  # the rank named once, by the owner
    assert "next request starts a new one" not in message  # a group is launched again
    assert took < 20, f"the launch took {took:.0f} s to fail"
    wait_until(lambda: not worker_pids(a) and not worker_pids(b), 10)
