"""`shoal plan MODEL`: where the model's layers would go and how fast it would run, on the
real cluster (asked through the local node) or on hardware described in a file
(--simulate). The planning itself is engine.placement, fed node information by
engine.node.planning; this module reads the file, parses options and prints."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine import placement_profiles
from engine.node.planning import (
    Layout,
    PlanLink,
    PlanNode,
    PlanReport,
    make_report,
    plan_from_cluster,
    prompt_assumptions,
    report_json,
)
from engine.placement.memory import context_label, gb
from engine.placement.model import QUANTIZATIONS, ModelSpec
from engine.placement.profiles import SimulationError, parse_simulation, profile_model
from engine.placement.split_prefill import (
    render_choice,
    render_split,
    split_json,
    split_rows,
)
from engine.placement.tables import Assumptions
from engine.placement.users import MAX_USERS, UsersReport, compare, describe
from engine.placement.users import to_json as users_json
from engine.placement.validate import PlacementError

# (node infos, links, model config) for a model, as the local node reports them
ClusterFetch = Callable[[str], tuple[Sequence[PlanNode], Sequence[PlanLink], Mapping[str, Any]]]


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
    p.add_argument("--rank", choices=("chat", "agents", "drafted", "decode"),
                   default="chat",
                   help="order placements for chat (decode tokens/s), for agents (time "
                        "to the first token of the longest --prompts that fits), or by "
                        "decode with drafts (the DRAFTED column); decode is chat")
    p.add_argument("--prompts", default="1000,10000,50000", metavar="N,N,...",
                   help="prompt lengths in tokens to predict the time to first token for "
                        "(default 1000,10000,50000; those longer than the context are "
                        "left out)")
    p.add_argument("--cached", type=float, default=0.0, metavar="SHARE",
                   help="the share of each prompt the prefix cache already holds, 0 to 1 "
                        "(an agent's next turn repeats most of its prompt; default 0)")
    p.add_argument("--kv-bits", type=int, choices=(16, 8, 4), default=16,
                   help="the KV cache's bits: 16, or quantized to 8 or 4 (default 16)")
    p.add_argument("--users", metavar="N,N,...",
                   help="compare replicas of the model against one instance for this "
                        "many people at once (e.g. 1,4,16; each 1 to 256)")
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
        a.assume = _assumptions(a)
        users = _users(a)
        if a.simulate:
            report = _simulate(a)
        elif cluster is None:
            print("shoal: planning on the running cluster isn't wired yet; use --simulate "
                  "FILE.json", file=sys.stderr)
            return 2
        else:
            infos, links, config = cluster(a.model)
            report = plan_from_cluster(infos, config, a.context, links, a.model,
                                       a.force, _layout(a),
                                       kv_bits=None if a.kv_bits == 16 else a.kv_bits,
                                       rank=a.rank, a=a.assume)
        if users and report.placements:
            answer = compare(report.model, report.nodes, report.links, users,
                             report.context, a.assume)
            print(json.dumps(users_json(answer)) if a.json else render_users(answer))
            return 0
    except PlacementError as e:
        print(f"shoal: {e}", file=sys.stderr)
        return 1
    # each placement one node serves alone, with each other node prefilling for it
    split = [(k, r) for k, p in enumerate(report.placements[:a.top], 1)
             for r in split_rows(report.model, p, report.nodes, report.links,
                                 sorted(set(a.assume.ttft_prompts)), a.assume)]
    if a.json:  # each placement with its prefill node and split rows, as POST /shoal/plan
        out = report_json(report)
        for info, extra in zip(out["placements"], split_json(
                report.model, report.placements, report.nodes, report.links, a.assume)):
            info.update(extra)
        print(json.dumps(out))
    else:
        lines = [render(report, a.top)]
        for k in dict.fromkeys(k for k, _ in split):
            lines += [f"#{k} {line}" for line in render_split([r for j, r in split
                                                               if j == k])]
        lines += [f"#{k} {render_choice(p.prefill)}"
                  for k, p in enumerate(report.placements[:a.top], 1) if p.prefill]
        print("\n".join(lines))
    return 0 if report.placements else 1


def _users(a: argparse.Namespace) -> list[int]:
    """--users as whole numbers, 1 to MAX_USERS each ([] where not given)."""
    if a.users is None:
        return []
    try:
        out = [int(x) for x in str(a.users).split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or len(out) > 16 or any(not 1 <= n <= MAX_USERS for n in out):
        raise PlacementError(f"--users: {a.users!r}: give 1 to 16 counts of people "
                             f"separated by commas, each 1 to {MAX_USERS}, e.g. 1,4,16")
    return sorted(set(out))


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
    if a.kv_bits != 16:
        model = model.with_kv_bits(a.kv_bits)
    return make_report(model, sim.nodes, sim.links,
                       a.context or sim.context or model.context, a.force, _layout(a), [],
                       a.rank, a=a.assume)


def _assumptions(a: argparse.Namespace) -> Assumptions:
    try:
        prompts = [int(x) for x in str(a.prompts).split(",") if x.strip()]
    except ValueError:
        raise PlacementError(f"--prompts: {a.prompts!r}: give token counts separated by "
                             f"commas, e.g. 1000,10000,50000") from None
    try:
        return prompt_assumptions(prompts, a.cached)
    except ValueError as e:
        raise PlacementError(f"--prompts/--cached: {e}") from None


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


# --- output --------------------------------------------------------------------------
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
    prompts = sorted({n for p in r.placements for n, *_ in p.prediction.ttft})
    cached = max((c / n for p in r.placements for n, c, *_ in p.prediction.ttft), default=0)
    ttft = "FIRST TOKEN s @" + "/".join(_tokens(n) for n in prompts) + \
        (f" ({cached:.0%} cached)" if cached else "")
    head = ["#", "STRATEGY", "BACKEND", "NODE", "LAYERS", "MEMORY GB (USABLE)",
            "DECODE tok/s", full, "PREFILL tok/s", "STREAMS tok/s", "DRAFTED tok/s",
            "J/TOKEN", *([ttft] if prompts else [])]
    rows = []
    for k, p in enumerate(r.placements[:top], 1):
        for j, rk in enumerate(p.ranks):
            s, e = rk.layers
            layers = f"all/{len(p.ranks)}" if p.strategy == "tensor" else f"{s}-{e - 1}"
            mem = f"{rk.memory.total / 1e9:.1f} ({rk.memory.usable / 1e9:.1f})"
            backend = p.backend if p.strategy != "single" else "-"
            first = [str(k), p.strategy, backend] if j == 0 else ["", "", ""]
            pred = [f"{p.decode_tps:.1f}", f"{p.prediction.decode_tps_full:.1f}",
                    f"{p.prefill_tps:.0f}", _streams(p.prediction),
                    _drafted(p.prediction), _joules(p.prediction),
                    *([_ttft(p.prediction) + _with_prefill(p)] if prompts else [])
                    ] if j == 0 else [""] * (7 if prompts else 6)
            rows.append([*first, rk.name, layers, mem + (" !" if not rk.memory.fits else ""),
                         *pred])
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
              for row in [head, *rows]]
    if len(r.placements) > top:
        lines.append(f"... and {len(r.placements) - top} more (--top N)")
    lines += [f"warning: {w}" for p in r.placements[:top] for w in p.warnings]
    return "\n".join(lines)


def _joules(p: Any) -> str:
    """Joules per decoded token, where every node's watts are known."""
    return f"{p.decode_j_per_token:.2g}" if p.decode_j_per_token else "-"


def _tokens(n: int) -> str:
    return f"{n // 1000}K" if n % 1000 == 0 else str(n)


def _seconds(s: float) -> str:
    return f"{s:.1f}" if s < 10 else f"{s:.0f}"


def _ttft(p: Any) -> str:
    """Seconds to the first token alone, per prompt length."""
    return "/".join(_seconds(alone) for _, _, alone, _ in p.ttft)


def _with_prefill(p: Any) -> str:
    """The longest prompt's first token with the prefill node it is ranked with (agents)."""
    return f" ({_seconds(p.prefill.row.split_s)} with {p.prefill.row.node})" \
        if p.prefill else ""


def _drafted(p: Any) -> str:
    """One sequence with drafts (speculative decoding, one node), and the guesses per pass."""
    return f"{p.decode_tps_drafted:.1f} (k={p.draft_tokens})" if p.decode_tps_drafted else "-"


def _streams(p: Any) -> str:
    """All of `streams` sequences decoding together, and the lanes a pipeline keeps."""
    lanes = f", {p.lanes} lanes" if p.lanes > 1 else ""
    return f"{p.decode_tps_streams:.1f} ({p.streams}{lanes})"


def render_users(r: UsersReport) -> str:
    """Replicas against one instance, two rows per count of people, then the verdicts."""
    lines = [f"{r.model} for many people at once: {context_label(r.context)} context, up "
             f"to {r.streams} streams per instance (more wait in its queue), first token "
             f"of a {_tokens(r.prompt)}-token prompt while the others decode",
             "replicas: " + ("; ".join(describe(p) for p in r.replica_set)
                             if len(r.replica_set) > 1 else "none, " + r.rows[0].why)]
    head = ["PEOPLE", "HOW", "ON", "TOKENS/S ALL", "EACH", "FIRST TOKEN s", "QUEUED",
            "KV GB NEED (ROOM)"]
    rows = []
    for row in r.rows:
        for s in (row.replicas, row.one):
            if s is None:
                rows.append([str(row.users), "replicas", "-", "-", "-", "-", "-", "-"])
                continue
            tight = max(s.copies, key=lambda c: c.kv_need - c.kv_room)
            on = f"{s.total} copies" if s.how == "replicas" else describe(
                s.copies[0].placement)
            rows.append([str(row.users), s.how, on, f"{s.tps:.1f}", f"{s.per_user_tps:.1f}",
                         _seconds(s.ttft_s), str(s.queued),
                         f"{tight.kv_need / 1e9:.1f} ({tight.kv_room / 1e9:.1f})"
                         + ("" if s.kv_fits else " !")])
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
              for row in [head, *rows]]
    lines += [f"{row.users}: {row.verdict}" for row in r.rows]
    return "\n".join(lines)
