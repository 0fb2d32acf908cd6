"""The planner's answer to "does prefilling on another node pay" (engine/placement/
split_prefill.py), on a simulated Mac Studio and an RTX 6000 Ada: the NVIDIA card's prefill
wins for the Mac on long prompts, a slow link takes the win away from short ones, the Mac
never pays as a prefill node for the card, and the KV counted is what the model keeps
(a sliding window's tokens at most, MLA's latent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.placement.split_prefill import kv_bytes

ROOT = Path(__file__).resolve().parents[3]


def profile(tmp: Path, link: str) -> Path:
    f = tmp / f"mac-rtx-{link}.json"
    f.write_text(json.dumps({
        "context": 32768,
        "nodes": [{"name": "studio", "profile": "mac-studio-m3-ultra", "memory_gb": 96,
                   "has_model_files": True},
                  {"name": "rtx", "profile": "rtx-6000-ada"}],
        "links": [{"a": "studio", "b": "rtx", "preset": link}]}))
    return f


def plan(sim: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "engine.cli", "plan", "Qwen3-30B-A3B", "--quant", "4bit",
         "--simulate", str(sim), "--prompts", "1000,8000,32000", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def rows(report: dict, decode: str, prefill: str) -> dict[int, dict]:
    """The split rows of the placement `decode` serves alone, with `prefill` prefilling."""
    return {r["prompt"]: r for p in report["placements"]
            if [k["node"] for k in p["ranks"]] == [decode]
            for r in p["split_prefill"] if r["node"] == prefill}


def test_the_cards_prefill_pays_for_the_mac_and_not_the_other_way(tmp_path: Path):
    report = plan(profile(tmp_path, "10gbe"))
    mac = rows(report, "studio", "rtx")
    # a 1000-token prompt is under the hand-over's minimum: the Mac prefills it itself
    assert set(mac) == {8000, 32000}
    assert all(r["pays"] and r["split_s"] < r["alone_s"] for r in mac.values())
    assert mac[32000]["alone_s"] / mac[32000]["split_s"] > 3
    # its parts add up: the card's prefill, the KV over 10GbE, one token here
    r = mac[32000]
    assert r["prefill_s"] + r["transfer_s"] < r["split_s"] < r["prefill_s"] + r["transfer_s"] + 1
    assert 0.8 < r["kv_bytes"] / 1.25e9 / r["transfer_s"] < 1.0  # 10 Gbit/s, less latency
    card = rows(report, "rtx", "studio")
    assert card and not any(r["pays"] for r in card.values())


def test_over_wifi_the_transfer_eats_into_the_win(tmp_path: Path):
    wifi = rows(plan(profile(tmp_path, "wifi")), "studio", "rtx")
    cable = rows(plan(profile(tmp_path, "10gbe")), "studio", "rtx")
    for n in (8000, 32000):
        assert wifi[n]["transfer_s"] > 5 * cable[n]["transfer_s"]
        assert wifi[n]["split_s"] > cable[n]["split_s"]
    # the same card and the same Mac: only the link differs
    assert wifi[32000]["prefill_s"] == cable[32000]["prefill_s"]


def test_the_kv_counted_is_what_the_model_keeps():
    from engine.placement.profiles import profile_model

    models = json.loads((ROOT / "resources/profiles/models.json").read_text())["models"]
    ds = profile_model(models["DeepSeek-V3.1"], "DeepSeek-V3.1", "4bit")
    oss = profile_model(models["gpt-oss-120b"], "gpt-oss-120b", None)
    # MLA: the 512 + 64 latent a layer, not 128 heads' keys and values
    assert kv_bytes(ds, 1000, 2) == 1000 * ds.layers * ds.kv_per_token * 2
    assert ds.kv_per_token < 2 * 128 * 128
    # sliding-window layers keep their window: a long prompt costs less than full layers'
    full = 32000 * oss.layers * oss.kv_per_token * 2
    assert kv_bytes(oss, 32000, 2) < 0.6 * full
