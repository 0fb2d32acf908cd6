"""Ranked for agents, a placement one node serves alone is ranked by its first token with
the prefill node that makes it soonest, where that beats its own, and a launch from it
names that node. On a simulated Mac Studio and an RTX 4090 (which can't hold the model
and a 32K context alone, but can prefill a 32K prompt for the Mac): the card prefills for
the Mac at 32K, not at 1K (under the hand-over's minimum, where a pipeline is soonest);
over Wi-Fi the KV's transfer eats the win and the ranking is the one without the split."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from engine import placement_profiles
from engine.node.handover import MIN_TOKENS
from engine.node.launch import LaunchRequest
from engine.node.planning import prompt_assumptions
from engine.placement.planner import Placement, plan
from engine.placement.profiles import parse_simulation, profile_model
from engine.placement.split_prefill import HANDOVER_MIN_TOKENS, split_rows

ROOT = Path(__file__).resolve().parents[3]
CARD = "gpu-box-7"  # the card's node id, apart from its name


def hardware(link: str) -> dict:
    return {"context": 32768,
            "nodes": [{"name": "studio", "profile": "mac-studio-m3-ultra", "memory_gb": 96,
                       "has_model_files": True},
                      {"id": CARD, "name": "rtx", "profile": "rtx-4090"}],
            "links": [{"a": "studio", "b": CARD, "preset": link}]}


def cli(tmp: Path, link: str, *args: str) -> subprocess.CompletedProcess:
    f = tmp / f"mac-4090-{link}.json"
    f.write_text(json.dumps(hardware(link)))
    out = subprocess.run([sys.executable, "-m", "engine.cli", "plan", "Qwen3-30B-A3B",
                          "--quant", "4bit", "--simulate", str(f), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def agents(tmp: Path, link: str, prompts: str, rank: str = "agents") -> list[dict]:
    out = cli(tmp, link, "--prompts", prompts, "--rank", rank, "--json")
    return json.loads(out.stdout)["placements"]


def on(p: dict) -> list[str]:
    return [r["node"] for r in p["ranks"]]


def test_agents_at_32k_take_the_cards_prefill_and_at_1k_dont(tmp_path: Path):
    long = agents(tmp_path, "10gbe", "32000")
    first = long[0]
    assert on(first) == ["studio"] and first["prefill"] == CARD
    row = next(r for r in first["split_prefill"] if r["node_id"] == CARD)
    assert row["node"] == "rtx" and row["pays"]
    # the Mac alone waits 44 s; the card's prefill and the KV over 10GbE, about 10 s:
    # sooner than every other placement's own first token (a pipeline over both: 20 s)
    assert row["alone_s"] / row["split_s"] > 3
    others = [p["ttft"][-1]["seconds"] for p in long[1:]]
    assert others and row["split_s"] < min(others)
    assert not any(p["prefill"] for p in long[1:])
    shown = cli(tmp_path, "10gbe", "--prompts", "32000", "--rank", "agents").stdout
    assert re.search(rf'#1 ranked with prefill on rtx: first token of a 32K-token prompt '
                     rf'in [\d.]+ s instead of [\d.]+ s; a launch from it names "prefill": '
                     rf'"{CARD}", "prefill_min": 1024 ', shown), shown
    # the FIRST TOKEN column: the Mac's own 44 s, and with the card prefilling
    assert shown.splitlines()[2].endswith(" 44 (10 with rtx)"), shown

    # 1000 tokens is under the hand-over's minimum: no split, the pipeline is soonest
    short = agents(tmp_path, "10gbe", "1000")
    assert on(short[0]) != ["studio"] and len(short[0]["ranks"]) == 2
    assert not any(p["prefill"] or p["split_prefill"] for p in short)

    # ranked for chat the placements keep their order and launch without a prefill node
    chat = agents(tmp_path, "10gbe", "32000", rank="chat")
    assert not any(p["prefill"] for p in chat)
    mac = next(p for p in chat if on(p) == ["studio"])
    assert [r["split_s"] for r in mac["split_prefill"]] == [row["split_s"]]


def test_where_the_split_doesnt_pay_the_agents_ranking_is_unchanged(tmp_path: Path):
    wifi = agents(tmp_path, "wifi", "8000,32000")
    mac = next(p for p in wifi if on(p) == ["studio"])
    assert mac["split_prefill"] and not any(r["pays"] for r in mac["split_prefill"])
    assert not any(p["prefill"] for p in wifi)
    # still ordered by each placement's own first token of the longest prompt
    waits = [float(f"{p['ttft'][-1]['seconds']:.3g}") for p in wifi]
    assert waits == sorted(waits)


def planned(link: str, prompt: int, rank: str = "agents"):
    """(the placements best first, the model, the simulated nodes and links)."""
    sim = parse_simulation(hardware(link), placement_profiles.machines(),
                           placement_profiles.models())
    prof = placement_profiles.models()["models"]["Qwen3-30B-A3B"]
    model = profile_model(prof, "Qwen3-30B-A3B", "4bit")
    return (plan(model, sim.nodes, sim.links, 32768, a=prompt_assumptions([prompt]),
                 rank=rank), model, sim.nodes, sim.links)


def placements(link: str, prompt: int, rank: str = "agents") -> list[Placement]:
    return planned(link, prompt, rank)[0]


def test_a_launch_from_the_plan_names_the_prefill_node():
    best = placements("10gbe", 32000)[0]
    body = best.to_launch()
    assert body["prefill"] == CARD and [n["node"] for n in body["nodes"]] == ["studio"]
    # over 10GbE the card pays from the hand-over's own minimum
    assert body["prefill_min"] == MIN_TOKENS
    req = LaunchRequest.model_validate(body)  # what POST /shoal/instances reads
    assert req.prefill == CARD and req.prefill_min == MIN_TOKENS
    assert req.nodes[0].layers == (0, 48)
    assert req.body()["prefill"] == CARD  # and hands on to the node that launches it
    # without a prefill node (ranked for chat) the launch names none
    assert all("prefill" not in p.to_launch() for p in placements("10gbe", 32000, "chat"))


def test_a_node_whose_speed_is_a_guess_is_never_made_the_prefill_node():
    """A node that has just started (no calibration, no profile of its chip: the planner
    assumes 2 TFLOPS for it) is no prefill node until it has measured itself."""
    from dataclasses import replace

    from engine.placement.split_prefill import prefer_split
    found, model, nodes, links = planned("10gbe", 32000)
    lone = next(p for p in found if [r.node for r in p.ranks] == ["studio"])
    assert lone.prefill is not None  # the card, measured (its profile)
    guessed = [replace(n, guessed=True) if n.id == CARD else n for n in nodes]
    again = prefer_split(model, [replace(lone, prefill=None)], guessed, links,
                         prompt_assumptions([32000]))
    assert again[0].prefill is None


def test_the_planners_minimum_is_the_hand_overs():
    assert HANDOVER_MIN_TOKENS == MIN_TOKENS


def test_over_a_slow_link_a_launch_hands_over_only_the_prompts_that_pay(tmp_path: Path):
    """Over 1GbE the card's prefill pays for 32K-token prompts but not 8K ones (the KV's
    transfer costs more than the card saves), so the launch's minimum lies between."""
    mac = next(p for p in placements("1gbe", 32000) if p.prefill)
    row = mac.prefill.row
    assert [r.node for r in mac.ranks] == ["studio"] and row.pays
    short = placements("1gbe", 8000)
    assert not any(p.prefill for p in short)
    body = mac.to_launch()
    assert body["prefill"] == CARD and 8000 < body["prefill_min"] < 32000
    # prompts from that length up to the longest pay; well short of it, they don't (near
    # it the Mac's first token climbs a chunk at a time, so the two cross back and forth)
    _, model, nodes, links = planned("1gbe", 32000)

    def pays(n: int) -> bool:
        (r,) = split_rows(model, mac, nodes, links, [n])
        return r.pays

    start = body["prefill_min"] + 1
    assert all(pays(n) for n in range(start, 32001, 1000))
    assert not any(pays(n) for n in (3000, 8000, 12000))
    assert LaunchRequest.model_validate(body).prefill_min == body["prefill_min"]
    # and `shoal plan` says so: a 1,025-token prompt gains a little, 8K loses, 32K gains
    shown = cli(tmp_path, "1gbe", "--prompts", "1025,8000,32000", "--rank", "agents").stdout
    assert "#2 with prefill on rtx: pays from 32K tokens. 1025: " in shown, shown
    assert '"prefill_min": 18937 ' in shown


def test_a_group_is_offered_a_prefill_node_outside_it(tmp_path: Path):
    """Two Mac minis hold a 70B model only together; a DGX Spark beside them holds it
    alone. Each placement over the two minis gets the Spark as its prefill node at 32K
    (its prefill, the KV to rank 0 and on to the other mini), and a launch from it names
    the Spark; no placement the Spark is in is offered it."""
    sim = {"context": 32768,
           "nodes": [{"name": n, "profile": "mac-mini-m4-pro", "memory_gb": 48,
                      "has_model_files": True} for n in ("mini1", "mini2")]
           + [{"id": "spark-1", "name": "spark", "profile": "dgx-spark"}],
           "links": [{"a": "mini1", "b": "mini2", "preset": "thunderbolt5"},
                     {"a": "mini1", "b": "spark-1", "preset": "10gbe"},
                     {"a": "mini2", "b": "spark-1", "preset": "10gbe"}]}
    f = tmp_path / "minis-spark.json"
    f.write_text(json.dumps(sim))
    out = subprocess.run([sys.executable, "-m", "engine.cli", "plan", "Llama-3.3-70B",
                          "--quant", "4bit", "--simulate", str(f), "--prompts", "32000",
                          "--rank", "agents", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    placements = json.loads(out.stdout)["placements"]
    minis = [p for p in placements if sorted(on(p)) == ["mini1", "mini2"]]
    assert {p["strategy"] for p in minis} == {"pipeline", "tensor"}
    for p in minis:
        assert p["prefill"] == "spark-1" and p["prefill_min"] == HANDOVER_MIN_TOKENS
        row = p["split_prefill"][0]
        # 10.5 GB of KV over 10GbE: about 8.4 s, far less than the minis' own prefill
        assert row["kv_bytes"] > 10e9 and 7 < row["transfer_s"] < 10
        assert row["pays"] and row["alone_s"] / row["split_s"] > 5
    assert not any(p["prefill"] or p["split_prefill"] for p in placements
                   if "spark" in on(p))
