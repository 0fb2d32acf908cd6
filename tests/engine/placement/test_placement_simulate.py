"""`shoal plan --simulate FILE.json`: hypothetical hardware from profiles or numbers, a
ranked table or the reasons nothing fits, and every mistake in the file named by field."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from placement_support import LLAMA_CONFIG

from engine import placement_profiles
from engine.node.planning import plan_from_cluster
from engine.placement.profiles import SimulationError, parse_simulation
from engine.placement.validate import PlacementError
from engine.placement_cli import add_plan_parser

STUDIOS = {
    "nodes": [{"name": "studio-1", "profile": "mac-studio-m3-ultra", "memory_gb": 512,
               "has_model_files": True},
              {"name": "studio-2", "profile": "mac-studio-m3-ultra", "memory_gb": 512}],
    "links": [{"mesh": "thunderbolt5-rdma"}],
    "models": [{"name": "ds8", "profile": "DeepSeek-V3.1", "quant": "8bit"},
               {"name": "tiny", "layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000,
                "total_params": 1e9, "active_params": 1e9, "quant": "4bit"}],
}


def _parse(data):
    return parse_simulation(data, placement_profiles.machines(), placement_profiles.models())


def _run(tmp_path: Path, data, *argv: str) -> tuple[int, str, str, pytest.CaptureFixture]:
    path = tmp_path / "sim.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    parser = argparse.ArgumentParser(prog="shoal")
    add_plan_parser(parser.add_subparsers())
    a = parser.parse_args(["plan", *argv, "--simulate", str(path)])
    return a.func(a)


def test_profiles_and_presets_become_nodes_and_links():
    sim = _parse(STUDIOS)
    a, b = sim.nodes
    # what the GPU may wire by default, by the rule the node's own probe follows
    assert a.memory_bytes == int(512 * 2 ** 30 * 0.84)
    assert a.memory_bandwidth_Bps == 819e9 and a.rdma and a.has_model_files
    kinds = sorted((k.rdma, round(k.latency_s * 1e6)) for k in sim.links)
    assert kinds == [(False, 300), (True, 10)]  # the cable carries TCP and RDMA
    assert sim.models["tiny"].layers == 4


@pytest.mark.parametrize("patch, field", [
    ({"nodes": []}, "nodes: expected a list of at least one node"),
    ({"nodes": [{"profile": "mac-mini-m4"}]}, "nodes[0].name: missing"),
    ({"nodes": [{"name": "x", "memory_gb": "lots", "bandwidth_gbs": 100, "tflops": 1}]},
     "nodes[0].memory_gb: expected a number > 0, got 'lots'"),
    ({"nodes": [{"name": "x", "memory_gb": 64, "tflops": 1}]},
     "nodes[0].bandwidth_gbs: missing"),
    ({"nodes": [{"name": "x", "profile": "mac-pro-9000"}]},
     "nodes[0].profile: no machine profile 'mac-pro-9000'"),
    ({"nodes": [{"name": "x", "profile": "mac-studio-m3-ultra"}]},
     "nodes[0].memory_gb: mac-studio-m3-ultra comes with 96, 256, 512 GB; say which"),
    ({"nodes": [{"name": "x", "profile": "mac-studio-m3-ultra", "memory_gb": 300}]},
     "nodes[0].memory_gb: mac-studio-m3-ultra comes with 96, 256, 512 GB, not 300"),
    ({"nodes": [{"name": "x", "profile": "mac-mini-m4-pro", "memory_gb": 64,
                 "wired_fraction": 1.5}]}, "nodes[0].wired_fraction: expected at most 1"),
    ({"nodes": [{"name": "x", "profile": "mac-mini-m4-pro", "memory_gb": 64,
                 "rdma": "yes"}]}, "nodes[0].rdma: expected true or false, got 'yes'"),
    ({"nodes": [{"name": "x", "profile": "mac-mini-m4", "memory_gb": 32}] * 2},
     "nodes[1].name: 'x' is used twice"),
    ({"links": [{"a": "studio-1", "b": "studio-9", "preset": "10gbe"}]},
     "links[0].b: no node 'studio-9' (nodes: studio-1, studio-2)"),
    ({"links": [{"a": "studio-1", "b": "studio-2", "preset": "carrier-pigeon"}]},
     "links[0].preset: no link profile 'carrier-pigeon'"),
    ({"links": [{"a": "studio-1", "b": "studio-2", "latency_us": 100}]},
     "links[0].bandwidth_gbit: missing"),
    ({"links": [{"mesh": "10gbe", "nodes": ["studio-1", "studio-7"]}]}, "links[0].nodes:"),
    ({"models": [{"name": "m", "layers": 4, "hidden": 64, "vocab": 10, "quant": "4bit"}]},
     "models[0].heads: missing"),
    ({"models": [{"name": "m", "profile": "DeepSeek-V3.1", "quant": "2bit"}]},
     "models[0].quant: unknown quantization '2bit'"),
    ({"models": [{"name": "m", "config": {"num_attention_heads": 8}}]},
     "models[0]: config.json has no hidden_size"),
    ({"models": [{"layers": 4}]}, "models[0].name: missing"),
    ({"context": "long"}, "context: expected a whole number of tokens, got 'long'"),
])
def test_a_bad_simulation_file_names_the_field(patch, field):
    with pytest.raises(SimulationError) as e:
        _parse({**STUDIOS, **patch})
    assert field in str(e.value)


def test_plan_prints_a_ranked_table(tmp_path, capsys):
    assert _run(tmp_path, STUDIOS, "ds8") == 0
    out = capsys.readouterr().out
    assert out.startswith("DeepSeek-V3.1 (8bit): 671.0B parameters")
    lines = out.splitlines()
    assert lines[1].split()[:5] == ["#", "STRATEGY", "BACKEND", "NODE", "LAYERS"]
    assert lines[2].split()[:5] == ["1", "tensor", "jaccl", "studio-1", "all/2"]
    assert "(461.8)" in lines[2]  # usable, next to what the node needs
    assert any(" pipeline " in ln and "ring" in ln and "0-" in ln for ln in lines)


def test_plan_json_and_profiles_without_a_file_entry(tmp_path, capsys):
    assert _run(tmp_path, STUDIOS, "qwen3-235b-a22b", "--quant", "4bit", "--json",
                "--context", "8192") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "Qwen3-235B-A22B (4bit)" and doc["context"] == 8192
    best = doc["placements"][0]
    assert best["decode_tps"] >= doc["placements"][-1]["decode_tps"]
    assert set(best["ranks"][0]["memory"]) >= {"weights", "kv_cache", "activations",
                                                "overhead", "total", "usable"}


def test_plan_predicts_the_first_token_and_ranks_for_agents(tmp_path, capsys):
    assert _run(tmp_path, STUDIOS, "ds8", "--context", "65536", "--rank", "agents",
                "--prompts", "2000,70000", "--cached", "0.5", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    rows = [p["ttft"] for p in doc["placements"]]
    # 70K is longer than the context; half of each prompt is in the prefix cache
    assert all([r["prompt_tokens"] for r in row] == [2000] for row in rows)
    assert all(row[0]["cached_tokens"] == 1000 for row in rows)
    waits = [float(f"{row[0]['seconds']:.3g}") for row in rows]
    assert waits == sorted(waits) and waits[0] > 0
    assert _run(tmp_path, STUDIOS, "ds8", "--context", "65536") == 0
    head = capsys.readouterr().out.splitlines()[1]
    assert head.endswith("FIRST TOKEN s @1K/10K/50K")


@pytest.mark.parametrize("args, message", [
    (["--prompts", "10k"], "--prompts: '10k'"),
    (["--prompts", "0"], "2 to 10,000,000"),
    (["--cached", "1.5"], "cached share"),
])
def test_plan_refuses_bad_prompt_lengths_by_name(tmp_path, capsys, args, message):
    assert _run(tmp_path, STUDIOS, "ds8", *args) == 1
    assert message in capsys.readouterr().err


def test_plan_lists_why_nothing_fits(tmp_path, capsys):
    assert _run(tmp_path, STUDIOS, "Kimi-K2", "--quant", "bf16") == 1
    out = capsys.readouterr().out
    assert "No placement fits:" in out
    assert "the weights alone need 2052.8 GB; studio-1 and studio-2 have 923.6 GB usable" in out


def test_plan_checks_a_placement_given_by_hand(tmp_path, capsys):
    assert _run(tmp_path, STUDIOS, "ds8", "--strategy", "pipeline",
                "--nodes", "studio-1:0-20,studio-2:20-61") == 1
    assert "node studio-2 needs" in capsys.readouterr().err
    assert _run(tmp_path, STUDIOS, "ds8", "--strategy", "pipeline", "--force",
                "--nodes", "studio-1:0-20,studio-2:20-61") == 0
    out = capsys.readouterr().out
    assert "warning: forced beyond the memory check: node studio-2 needs" in out
    assert _run(tmp_path, STUDIOS, "ds8", "--strategy", "pipeline",
                "--nodes", "studio-1:0-x") == 1
    assert "layers must be START-END" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ("{not json", "sim.json: not JSON (line 1"),
    ({**STUDIOS, "nodes": [{"name": "a", "memory_gb": -1, "bandwidth_gbs": 1, "tflops": 1}]},
     "sim.json: nodes[0].memory_gb: expected a number > 0, got -1"),
])
def test_plan_reports_a_bad_file_and_exits_1(tmp_path, capsys, content, message):
    assert _run(tmp_path, content, "ds8") == 1
    assert message in capsys.readouterr().err


def test_plan_names_the_models_it_knows(tmp_path, capsys):
    assert _run(tmp_path, STUDIOS, "llama-5") == 1
    err = capsys.readouterr().err
    assert "no model 'llama-5'" in err and "ds8" in err and "DeepSeek-V3.1" in err


def test_plan_from_what_nodes_report():
    infos = [{"id": "n1", "name": "studio", "chip": "Apple M3 Ultra", "gpu_cores": 80,
              "memory_usable_bytes": 400e9, "models": ["llama"]},
             {"id": "n2", "name": "linux-box", "memory_bytes": 64e9}]
    report = plan_from_cluster(infos, LLAMA_CONFIG, 8192, [], model_name="llama")
    assert any("linux-box: no bandwidth/compute figures" in n for n in report.notes)
    assert any("assumed 10gbe" in n for n in report.notes)
    best = report.placements[0]
    assert best.strategy == "single" and best.ranks[0].name == "studio"
    assert best.files_on == 1 and best.ranks[0].memory.usable == 400e9


def test_a_peer_that_hasnt_told_its_memory_is_left_out_not_fatal():
    studio = {"id": "n1", "name": "studio", "chip": "Apple M3 Ultra", "gpu_cores": 80,
              "memory_usable_bytes": 400e9, "models": ["llama"]}
    report = plan_from_cluster([studio, {"id": "n2", "name": "just-started"}],
                               LLAMA_CONFIG, 8192, [], model_name="llama")
    assert report.placements and all(r.name == "studio" for p in report.placements
                                     for r in p.ranks)
    assert any("just-started hasn't reported its memory yet" in n for n in report.notes)
    with pytest.raises(PlacementError, match="hasn't reported its memory yet"):
        plan_from_cluster([{"id": "n2", "name": "just-started"}], LLAMA_CONFIG, 8192, [])


def test_the_shipped_example_file_plans(capsys):
    example = placement_profiles.PROFILES / "example-simulation.json"
    sim = _parse(json.loads(example.read_text()))
    assert set(sim.models) == {"ds4", "my-moe"} and sim.context == 32768
    parser = argparse.ArgumentParser(prog="shoal")
    add_plan_parser(parser.add_subparsers())
    a = parser.parse_args(["plan", "my-moe", "--simulate", str(example)])
    assert a.func(a) == 0
    assert "tensor    jaccl" in capsys.readouterr().out
