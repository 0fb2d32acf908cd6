"""`shoal plan --users`: replicas of a model against one instance for N people at once, on
the example simulation profile (four M3 Ultra Mac Studios cabled for RDMA and a Mac mini),
through the CLI as a user runs it, and the node's plan route refusing a bad count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from engine import placement_profiles
from engine.placement.profiles import parse_simulation, profile_model
from engine.placement.users import compare, replica_set

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "resources" / "profiles" / "example-simulation.json"
SIM = parse_simulation(json.loads(EXAMPLE.read_text()), placement_profiles.machines(),
                       placement_profiles.models())
PROFILES = placement_profiles.models()["models"]


def model(name: str):
    return SIM.models.get(name) or profile_model(PROFILES[name], name, "4bit", "quant")


def answer(name: str, users: list[int], nodes=SIM.nodes, links=SIM.links):
    return {row.users: row for row in compare(model(name), nodes, links, users,
                                              SIM.context).rows}


def test_a_model_one_node_holds_is_served_best_by_replicas_when_many_ask():
    # my-moe (120B MoE, 4-bit, 68 GB) fits each Studio alone, not the 64 GB mini
    copies, why = replica_set(model("my-moe"), SIM.nodes, SIM.links, SIM.context)
    assert [[r.name for r in p.ranks] for p in copies] == \
        [["studio-1"], ["studio-2"], ["studio-3"], ["studio-4"]] and why == ""
    row = answer("my-moe", [32])[32]
    assert row.replicas is not None and row.replicas.tps > 1.05 * row.one.tps
    assert row.verdict.startswith("Replicas: 4 copies of my-moe")
    assert row.replicas.queued == 0  # 8 each, within a node's 16 streams
    assert row.one.queued == 16  # one instance batches 16; the other 16 wait
    assert row.replicas.kv_fits


def test_for_one_person_one_instance_is_at_least_as_good():
    for name in ("my-moe", "ds4", "Qwen3-32B"):
        row = answer(name, [1])[1]
        assert row.replicas is not None
        assert row.one.tps >= row.replicas.tps and row.one.per_user_tps >= \
            row.replicas.per_user_tps
        assert row.verdict.startswith("One instance: for 1 person one copy is enough")
        assert row.one.queued == row.replicas.queued == 0


def test_a_model_that_fits_only_across_nodes_has_no_replicas_and_says_why():
    rows = answer("Kimi-K2", [1, 32])  # ~580 GB at 4 bits: two 512 GB Studios together
    for row in rows.values():
        assert row.replicas is None
        assert "it fits only across 2 nodes (studio-1 and studio-2)" in row.why
        assert "can't hold a second copy" in row.verdict
        assert row.verdict.startswith("One instance")
    assert rows[32].one.queued == 16 and "16 wait for a free stream" in rows[32].verdict


def test_more_people_than_kv_room_is_marked():
    # a 64k context for 8 streams of a 70B dense model on one 128 GB box: not enough KV
    nodes = [{"name": "box", "memory_gb": 128, "usable_gb": 110, "bandwidth_gbs": 400,
              "tflops": 14}]
    sim = parse_simulation({"nodes": nodes, "links": []}, placement_profiles.machines(),
                           placement_profiles.models())
    spec = profile_model(PROFILES["Llama-3.3-70B"], "Llama-3.3-70B", "4bit", "quant")
    row = compare(spec, sim.nodes, sim.links, [1, 8], 65536).rows
    assert row[0].one.kv_fits and not row[1].one.kv_fits
    assert "doesn't fit on box" in row[1].verdict


def test_bad_counts_are_refused():
    for bad in (0, 257, True, 2.5):
        with pytest.raises(ValueError, match="users must be whole numbers from 1 to 256"):
            compare(model("my-moe"), SIM.nodes, SIM.links, [bad], SIM.context)


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine.cli", "plan", *argv],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def test_the_cli_prints_the_table_and_a_verdict_per_count():
    out = _cli("my-moe", "--users", "1,4,32", "--simulate", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == "replicas: studio-1; studio-2; studio-3; studio-4"
    assert lines[2].split()[:4] == ["PEOPLE", "HOW", "ON", "TOKENS/S"]
    table = [ln.split() for ln in lines[3:9]]
    assert [(r[0], r[1]) for r in table] == [
        ("1", "replicas"), ("1", "one"), ("4", "replicas"), ("4", "one"),
        ("32", "replicas"), ("32", "one")]
    verdicts = lines[9:]
    assert verdicts[0].startswith("1: One instance") and \
        verdicts[2].startswith("32: Replicas: 4 copies")
    data = json.loads(_cli("my-moe", "--users", "32", "--json", "--simulate",
                           str(EXAMPLE)).stdout)
    row = data["rows"][0]
    assert row["winner"] == "replicas" and row["replicas"]["instances"] == 4
    assert row["one_instance"]["queued"] == 16 and row["replicas"]["tps"] > \
        row["one_instance"]["tps"]


def test_the_cli_refuses_a_bad_count_with_the_option_named():
    out = _cli("my-moe", "--users", "4,zero", "--simulate", str(EXAMPLE))
    assert out.returncode == 1 and "--users: '4,zero'" in out.stderr and not out.stdout


@pytest.fixture(scope="module")
def node(tmp_path_factory, tiny_model_dir):
    from nodes import NodeProcess, home_with

    n = NodeProcess(home_with(tmp_path_factory.mktemp("users"), tiny_model_dir),
                    "none").wait_healthy()
    yield n
    n.stop()


@pytest.mark.parametrize("users", [0, 257, "4", 2.5, True, None])
def test_the_plan_route_refuses_a_bad_users_count(node, users):
    r = httpx.post(f"{node.url}/shoal/plan", json={"model": "tiny-llama", "users": users},
                   timeout=60)
    if users is None:  # left out: no comparison, the plan as before
        assert r.status_code == 200 and "users" not in r.json()
        return
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "users" and "1 to 256" in r.json()["error"]["message"]


def test_the_plan_route_answers_for_a_count(node):
    r = httpx.post(f"{node.url}/shoal/plan", json={"model": "tiny-llama", "users": 4},
                   timeout=60)
    assert r.status_code == 200, r.text
    row = r.json()["users"]["rows"][0]
    assert row["users"] == 4 and row["one_instance"]["copies"][0]["streams"] == 4
    assert row["verdict"].startswith("One instance")  # one node: nothing to replicate
    assert row["no_replicas"] and "there are no other nodes" in row["no_replicas"]


def test_the_cli_asks_the_live_cluster(node):
    out = _cli("tiny-llama", "--users", "1,32", "--url", node.url)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].startswith("replicas: none, only ") and \
        lines[1].endswith("can hold a copy, and there are no other nodes")
    assert lines[-2].startswith("1: One instance") and lines[-1].startswith("32: One instance")
    assert "16 wait for a free stream" in lines[-1]
