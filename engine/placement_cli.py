"""`shoal plan MODEL`: where the model's layers would go and how fast it would run, on the
real cluster (asked through the local node) or on hardware described in a file
(--simulate). The planning itself is engine.placement; this module reads files, turns
node information into specs and prints."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from engine import placement_profiles
from engine.placement.tables import DEFAULT
from engine.placement.memory import context_label, gb
from engine.placement.model import QUANTIZATIONS, LinkSpec, ModelSpec, NodeSpec
from engine.placement.planner import Placement, Rejection, evaluate, explain, plan
from engine.placement.profiles import (SimulationError, links_from, parse_simulation,
                                       profile_model)
from engine.placement.validate import PlacementError

# (node infos, links, model config) for a model, as the local node reports them
ClusterFetch = Callable[[str], tuple[Sequence[Mapping[str, Any]],
                                     Sequence[Mapping[str, Any]], Mapping[str, Any]]]
Layout = tuple[str, str, list[Any]]  # strategy, backend, node names or {"node", "layers"}
FALLBACK_LINK = "10gbe"  # between nodes whose link nobody has measured yet


@dataclass(frozen=True)
class PlanReport:
    model: ModelSpec
    context: int
    placements: list[Placement]
    rejections: list[Rejection]
    notes: list[str] = field(default_factory=list)


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `shoal plan` on the main parser's subparsers."""
    p = subparsers.add_parser("plan", help="where a model's layers would go, and how fast "
                              "it would run")
    p.add_argument("model", help="a model on the cluster, a model named in the --simulate "
                   "file, or a model profile (e.g. DeepSeek-V3.1)")
    p.add_argument("--context", type=int, help="tokens of context to reserve KV cache for "
                   "(default: the model's, at most 32768)")
    p.add_argument("--simulate", metavar="FILE.json", help="plan on the hardware described "
                   "in this file instead of the running cluster")
    p.add_argument("--quant", help="quantization for a model profile: bf16, 8bit, 4bit...")
    p.add_argument("--strategy", choices=("pipeline", "tensor"), help="check this strategy "
                   "on --nodes instead of planning")
    p.add_argument("--nodes", help="with --strategy: rank order, e.g. a,b or a:0-30,b:30-61")
    p.add_argument("--backend", choices=("ring", "jaccl"), default="ring")
    p.add_argument("--force", action="store_true", help="accept placements beyond the "
                   "memory check (they may swap or fail to load)")
    p.add_argument("--top", type=int, default=10, help="placements to show (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--url", default="http://127.0.0.1:8421", help="the local node")
    p.set_defaults(func=cmd_plan)
    return p


def cmd_plan(a: argparse.Namespace, cluster: ClusterFetch | None = None) -> int:
    """Run `shoal plan`; `cluster` asks the local node when there is no --simulate."""
    try:
        if a.simulate:
            report = _simulate(a)
        elif cluster is None:
            print("shoal: planning on the running cluster isn't wired yet; use --simulate "
                  "FILE.json", file=sys.stderr)
            return 2
        else:
            infos, links, config = cluster(a.model)
            report = plan_from_cluster(infos, config, a.context, links, a.model,
                                       a.force, _layout(a))
    except PlacementError as e:
        print(f"shoal: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report_json(report)) if a.json else render(report, a.top))
    return 0 if report.placements else 1


def _simulate(a: argparse.Namespace) -> PlanReport:
    path = Path(a.simulate)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SimulationError(f"{path}: can't read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise SimulationError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    try:
        sim = parse_simulation(data, placement_profiles.machines(),
                               placement_profiles.models())
    except SimulationError as e:
        raise SimulationError(f"{path}: {e}") from None
    model = _find_model(a.model, sim.models, a.quant)
    return _report(model, sim.nodes, sim.links, a.context or sim.context or model.context,
                   a.force, _layout(a), [])


def _find_model(name: str, models: Mapping[str, ModelSpec], quant: str | None) -> ModelSpec:
    for key, spec in models.items():
        if key.lower() == name.lower():
            return spec if quant is None else _requant(spec, quant)
    profiles = placement_profiles.models()["models"]
    for key, prof in profiles.items():
        if key.lower() == name.lower():
            return profile_model(prof, key, quant or prof.get("default_quant", "bf16"),
                                 "--quant")
    raise SimulationError(f"no model {name!r} in the file or the profiles (known: "
                          f"{', '.join([*models, *profiles])})")


def _requant(spec: ModelSpec, quant: str) -> ModelSpec:
    if quant not in QUANTIZATIONS:
        raise SimulationError(f"--quant: unknown quantization {quant!r}")
    return spec.with_quantization(QUANTIZATIONS[quant])


def _layout(a: argparse.Namespace) -> Layout | None:
    if not a.strategy:
        return None
    if not a.nodes:
        raise PlacementError("--strategy needs --nodes (rank order, e.g. a,b or "
                             "a:0-30,b:30-61)")
    out: list[str | dict[str, Any]] = []
    for item in a.nodes.split(","):
        name, _, span = item.strip().partition(":")
        if not span:
            out.append(name)
            continue
        start, _, end = span.partition("-")
        if not (start.isdigit() and end.isdigit()):
            raise PlacementError(f"--nodes: {item!r}: layers must be START-END, e.g. a:0-30")
        out.append({"node": name, "layers": [int(start), int(end)]})
    return a.strategy, a.backend, out


def _report(model: ModelSpec, nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
            context: int, force: bool, layout: Layout | None,
            notes: list[str]) -> PlanReport:
    if layout is not None:  # a placement chosen by hand: its prediction, or why not
        strategy, backend, ranks = layout
        one = evaluate(model, nodes, links, context, strategy, ranks, backend, force)
        return PlanReport(model, context, [one], [], notes)
    return PlanReport(model, context, plan(model, nodes, links, context, force),
                      explain(model, nodes, links, context), notes)


def plan_from_cluster(node_infos: Sequence[Mapping[str, Any]], model_config: Mapping[str, Any],
                      context: int | None = None,
                      links: Sequence[Mapping[str, Any]] | None = None,
                      model_name: str | None = None, force: bool = False,
                      layout: Layout | None = None) -> PlanReport:
    """Plan from what nodes report, as plain dicts.

    node_infos: {"id", "name", "memory_usable_bytes" (the GPU working-set limit) or
    "memory_bytes" (RAM; 75% is assumed usable), optional "memory_bandwidth_Bps",
    "compute_flops", "chip" (e.g. "Apple M3 Ultra", to look up missing figures),
    "has_model" or "models" (ids on disk), "rdma"}. links: {"a", "b", "latency_s",
    "bandwidth_Bps", "rdma"} from the link probes; unmeasured pairs are assumed 10GbE.
    model_config: the model's config.json."""
    notes: list[str] = []
    model = ModelSpec.from_config(model_config, name=model_name)
    nodes = [_node_from_info(i, info, model_name, notes) for i, info in enumerate(node_infos)]
    specs = [LinkSpec(str(k["a"]), str(k["b"]), float(k["latency_s"]),
                      float(k["bandwidth_Bps"]), bool(k.get("rdma", False)))
             for k in links or []]
    known = {frozenset((k.a, k.b)) for k in specs if not k.rdma}
    missing = [[x.id, y.id] for i, x in enumerate(nodes) for y in nodes[i + 1:]
               if frozenset((x.id, y.id)) not in known]
    if missing:
        presets = placement_profiles.machines()
        ids = [nd.id for nd in nodes]
        specs += [s for pair in missing for s in
                  links_from({"a": pair[0], "b": pair[1], "preset": FALLBACK_LINK},
                             "links", presets, ids)]
        notes.append(f"{len(missing)} node pair(s) have no link measurement yet; assumed "
                     f"{FALLBACK_LINK}")
    return _report(model, nodes, specs, context or model.context, force, layout, notes)


def _node_from_info(i: int, info: Mapping[str, Any], model_name: str | None,
                    notes: list[str]) -> NodeSpec:
    nid = str(info.get("id") or info.get("name") or f"node-{i}")
    name = str(info.get("name") or nid)
    prof = _chip_profile(str(info.get("chip") or ""), info.get("gpu_cores"))
    usable = info.get("memory_usable_bytes") or 0.75 * float(info.get("memory_bytes") or 0)
    if not usable:
        raise PlacementError(f"node {name} reports no memory size")
    bw = info.get("memory_bandwidth_Bps") or (prof or {}).get("memory_bandwidth_gbs", 0) * 1e9
    flops = info.get("compute_flops") or (prof or {}).get("fp16_tflops", 0) * 1e12
    if info.get("measured_bandwidth_Bps"):  # measured figures are what a step really gets:
        bw = info["measured_bandwidth_Bps"] / DEFAULT.bandwidth_efficiency  # undo the
    if info.get("measured_flops"):  # efficiency factors the model applies to peak figures
        flops = info["measured_flops"] / DEFAULT.compute_efficiency
    if not bw or not flops:
        bw, flops = bw or 100e9, flops or 2e12
        notes.append(f"{name}: no bandwidth/compute figures for chip {info.get('chip')!r}; "
                     f"assumed {bw / 1e9:.0f} GB/s and {flops / 1e12:.0f} TFLOPS")
    has = bool(info.get("has_model")) or (model_name is not None and
                                          model_name in (info.get("models") or []))
    return NodeSpec(nid, name, int(usable), float(bw), float(flops), has,
                    bool(info.get("rdma", False)))


def _chip_profile(chip: str, gpu_cores: Any) -> dict[str, Any] | None:
    matches = [m for m in placement_profiles.machines()["machines"].values()
               if chip and m["chip"].lower() == chip.lower()]
    exact = [m for m in matches if m["gpu_cores"] == gpu_cores]
    return (exact or matches or [None])[0]


# --- output --------------------------------------------------------------------------
def report_json(r: PlanReport) -> dict[str, Any]:
    from engine.placement.families import strategy_refusal

    mtype = r.model.model_type
    return {"model": r.model.name, "context": r.context, "notes": r.notes,
            # the family rule: why a strategy can't run this model at all (None: it can)
            "strategies": {s: strategy_refusal(mtype, s) if mtype else None
                           for s in ("pipeline", "tensor")},
            "placements": [p.as_dict() for p in r.placements],
            "rejected": [{"strategy": x.strategy, "backend": x.backend,
                          "nodes": list(x.nodes), "reason": x.reason}
                         for x in r.rejections]}


def render(r: PlanReport, top: int = 10) -> str:
    m = r.model
    lines = [f"{m.name}: {m.total_params / 1e9:.1f}B parameters ({m.active_params / 1e9:.1f}B "
             f"read per token), {gb(m.total_params * m.bytes_per_param)} of weights; "
             f"{context_label(r.context)} context", *(f"note: {n}" for n in r.notes)]
    if not r.placements:
        lines.append("No placement fits:")
        seen: set[str] = set()
        for x in sorted(r.rejections, key=lambda x: -len(x.nodes)):
            if x.reason not in seen and len(seen) < 8:
                seen.add(x.reason)
                lines.append(f"  {x.strategy}/{x.backend} on {', '.join(x.nodes)}: "
                             f"{x.reason}")
        return "\n".join(lines)
    full = f"@{context_label(r.context)}"
    head = ["#", "STRATEGY", "BACKEND", "NODE", "LAYERS", "MEMORY GB (USABLE)",
            "DECODE tok/s", full, "PREFILL tok/s"]
    rows = []
    for k, p in enumerate(r.placements[:top], 1):
        for j, rk in enumerate(p.ranks):
            s, e = rk.layers
            layers = f"all/{len(p.ranks)}" if p.strategy == "tensor" else f"{s}-{e - 1}"
            mem = f"{rk.memory.total / 1e9:.1f} ({rk.memory.usable / 1e9:.1f})"
            backend = p.backend if p.strategy != "single" else "-"
            first = [str(k), p.strategy, backend] if j == 0 else ["", "", ""]
            pred = [f"{p.decode_tps:.1f}", f"{p.prediction.decode_tps_full:.1f}",
                    f"{p.prefill_tps:.0f}"] if j == 0 else ["", "", ""]
            rows.append([*first, rk.name, layers, mem + (" !" if not rk.memory.fits else ""),
                         *pred])
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
              for row in [head, *rows]]
    if len(r.placements) > top:
        lines.append(f"... and {len(r.placements) - top} more (--top N)")
    lines += [f"warning: {w}" for p in r.placements[:top] for w in p.warnings]
    return "\n".join(lines)
