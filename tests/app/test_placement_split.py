"""The placement view says whether another machine prefilling long prompts would pay: on
a real two-node cluster on loopback (the tiny model on both, alike) it wouldn't, and the
view says so with the node's own figures; on the planner's answer for a Mac Studio beside
an RTX 4090 ranked for agents (`shoal plan --json`, the shape POST /shoal/plan answers) it
says the card's prefill brings a 32K-token prompt's first token forward."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from engine.cluster_records import PlanInfo
from nodes import ROOT


@pytest.fixture
def view(placement_view, cluster):
    place = placement_view(cluster[0])
    return SimpleNamespace(place=place, cluster=cluster)


def test_between_two_alike_machines_a_prefill_node_wouldnt_pay(qtbot, view, monkeypatch):
    place, (a, b) = view.place, view.cluster
    qtbot.waitUntil(lambda: place.prediction is not None, timeout=30000)
    # the tiny model's 4K context holds only the 1K prompt, too short to hand over
    assert len(place.prediction["ranks"]) == 1 and place.prediction["split_prefill"] == []
    assert not place.split_label.isVisible()

    # asked for 2,000 and 4,000-token prompts, the node's planner splits them
    client, real = a.client, a.client._call

    def with_prompts(method, path, **kw):
        if path == "/shoal/plan":
            kw["json"] = {**kw["json"], "prompt_tokens": [2000, 4000]}
        return real(method, path, **kw)

    monkeypatch.setattr(client, "_call", with_prompts)
    place.best()
    qtbot.waitUntil(lambda: place.split_label.isVisible(), timeout=30000)
    name = b.client.status().cluster.name
    text = place.split_label.text()
    assert re.fullmatch(
        rf"A prefill node wouldn't pay here: with {re.escape(name)} prefilling, a "
        r"4K-token prompt would get its first token in [\d.]+ m?s instead of [\d.]+ m?s "
        r"\(its KV cache, [\d.]+ [kMG]B, takes \d+ ms over the link\)\.", text), text
    # the figures are the node's: the split's row for the longest prompt
    row = next(r for r in place.prediction["split_prefill"] if r["prompt"] == 4000)
    assert not row["pays"] and row["node"] == name
    assert f"{row['transfer_s'] * 1000:.0f} ms over" in text
    assert place.prediction.get("prefill") is None


def test_a_card_prefilling_for_a_mac_is_said_with_its_figures(qtbot, view, tmp_path,
                                                             monkeypatch):
    place = view.place
    qtbot.waitUntil(lambda: place.prediction is not None, timeout=30000)
    sim = tmp_path / "mac-4090.json"
    sim.write_text(json.dumps({
        "context": 32768,
        "nodes": [{"name": "studio", "profile": "mac-studio-m3-ultra", "memory_gb": 96,
                   "has_model_files": True},
                  {"name": "rtx", "profile": "rtx-4090"}],
        "links": [{"a": "studio", "b": "rtx", "preset": "10gbe"}]}))
    out = subprocess.run(
        [sys.executable, "-m", "engine.cli", "plan", "Qwen3-30B-A3B", "--quant", "4bit",
         "--simulate", str(sim), "--prompts", "8000,32000", "--rank", "agents", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    answer = {**json.loads(out.stdout), "best": 0}
    assert answer["placements"][0]["prefill"] == "rtx"
    # the view's node answers with that plan (as the client reads POST /shoal/plan)
    monkeypatch.setattr(place.client, "plan", lambda *a, **k: PlanInfo.from_json(answer))
    place.rank_box.setCurrentIndex(place.rank_box.findData("agents"))
    qtbot.waitUntil(lambda: place.split_label.text().startswith("Prefill on"), timeout=10000)
    assert place.split_label.isVisible()
    assert place.split_label.text() == (
        "Prefill on rtx: first token in 10 s instead of 44 s for a 32K-token prompt "
        "(its KV cache, 3.1 GB, takes 2.5 s over the link).")
    assert place.ttft_label.text().startswith("Predicted first token: 5.5 s at 8K · 44 s "
                                              "at 32K")
    # Launch sends the planner's prefill node with the placement
    assert place.launch.prefill == ("rtx", answer["placements"][0]["prefill_min"])
    sent: dict = {}
    monkeypatch.setattr(place.client, "_call",
                        lambda method, path, **kw: sent.update(kw["json"]) or {})
    place.launch.start()
    qtbot.waitUntil(lambda: bool(sent), timeout=10000)
    assert sent["prefill"] == "rtx" and sent["prefill_min"] == \
        answer["placements"][0]["prefill_min"]
