"""When prefilling on another node pays (engine/node/handover.py does it): a placement
(one node, or a group: engine/node/handover_group.py) may have a prompt prefilled by a
node outside it, whose KV then crosses the link to its rank 0 (and on to its other
nodes). Time to first token with the split is the prefill node's
prefill of the prompt, the KV's transfer (`layers x K and V per token x bytes` for each
token, a sliding-window layer's window at most, MLA's latent where the model has it), and
the decode node's one-token step; without it, the decode node's own prefill. The figures
are the planner's own (engine/placement/cost.py), so a node with a faster prefill (an
NVIDIA GPU) wins on long prompts and loses on short ones, where the transfer dominates.
Ranked for agents (planner.plan's "agents"), a placement that a prefill node makes sooner
for the longest prompt is ranked by that time and launched with it (prefer_split)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from engine.placement.cost import Stage, batched_step_s, pipeline_step_s, ttft_s
from engine.placement.links import PlacementError, Topology, ring_links
from engine.placement.model import LinkSpec, ModelSpec, NodeSpec
from engine.placement.tables import DEFAULT, Assumptions

if TYPE_CHECKING:  # the planner imports this module to rank for agents
    from engine.placement.planner import Placement

# engine/node/handover.py's MIN_TOKENS (a launch's default "prefill_min"): a prompt with
# fewer uncached tokens than this, less its last, runs on the decode node as it is
HANDOVER_MIN_TOKENS = 1024


@dataclass(frozen=True)
class SplitRow:
    node: str  # the prefill node's name
    node_id: str
    prompt: int
    alone_s: float  # the placement's own time to first token (its cached share kept)
    split_s: float  # with the prefill node prefilling
    prefill_s: float  # of it, the prefill node's prefill
    transfer_s: float  # of it, the KV over the link
    kv_bytes: int

    @property
    def pays(self) -> bool:
        return self.split_s < self.alone_s


def kv_bytes(model: ModelSpec, tokens: int, bytes_per_value: float) -> int:
    """The KV a prompt of `tokens` tokens leaves in every layer, as handed over."""
    per_layer = [model.layer_kv_tokens(i, tokens) for i in range(model.layers)]
    return int(sum(per_layer) * model.kv_per_token * bytes_per_value)


def split_rows(model: ModelSpec, placement: Placement, nodes: Sequence[NodeSpec],
               links: Sequence[LinkSpec], prompts: Sequence[int],
               a: Assumptions = DEFAULT) -> list[SplitRow]:
    """For a placement: each node outside it that holds the whole model and has a link
    to its rank 0, at each prompt length the context holds and the hand-over takes
    (HANDOVER_MIN_TOKENS uncached, less the last, or more). The prefill node runs the
    whole prompt (the hand-over starts from a fresh cache); the placement alone runs what
    its prefix cache doesn't hold (a.prompt_cached), as its own prediction does. A group's
    other nodes copy the KV from rank 0's node as it lands there
    (engine/node/handover_group.py): the slower of the two transfers counts."""
    by_id = {n.id: n for n in nodes}
    order = [by_id.get(r.node) for r in placement.ranks]
    if not order or any(nd is None for nd in order):
        return []
    group = [nd for nd in order if nd is not None]
    home, inside = group[0], {nd.id for nd in group}
    if placement.strategy == "single":
        stages, ring = [Stage(home, (0, model.layers), True)], []
    else:
        stages = [Stage(nd, r.layers, i == 0)
                  for i, (nd, r) in enumerate(zip(group, placement.ranks))]
        try:
            ring = ring_links(Topology(links), group, placement.backend)
        except PlacementError:
            return []
    copies = [_link(links, home.id, nd.id) for nd in group[1:]]
    if any(k is None or k.bandwidth_Bps <= 0 for k in copies):
        return []
    overlap = placement.strategy == "pipeline" and a.streams > 1  # as the prediction's
    weights = model.total_params * model.bytes_per_param
    rows = []
    for node in nodes:
        link = _link(links, home.id, node.id)
        if node.id in inside or link is None or link.bandwidth_Bps <= 0:
            continue
        for n in (n for n in prompts if n <= placement.context and
                  n - 1 - int(n * a.prompt_cached) >= HANDOVER_MIN_TOKENS):
            # a CPU node's KV is float32; quantized KV crosses quantized
            per_value = model.kv_bytes if model.kv_bytes != 2 else 4.0 if node.unpacks else 2.0
            moved = kv_bytes(model, n - 1, per_value)
            if weights + moved > node.memory_bytes:
                continue
            alone = ttft_s(model, placement.strategy, stages, ring, n,
                           int(n * a.prompt_cached), 0, overlap, a)
            there = ttft_s(model, "single", [Stage(node, (0, model.layers), True)], [], n,
                           a=a)
            transfer = link.latency_s + max(
                moved / k.bandwidth_Bps for k in [link, *copies] if k is not None)
            lead = _one_token_s(model, placement.strategy, stages, ring, n, a)
            rows.append(SplitRow(node.name, node.id, n, alone, there + transfer + lead, there,
                                 transfer, moved))
    return rows


def _one_token_s(model: ModelSpec, strategy: str, stages: Sequence[Stage],
                 ring: Sequence[LinkSpec], position: int, a: Assumptions) -> float:
    """The prompt's last token through the placement, after the handed-over KV."""
    if strategy == "tensor":
        return batched_step_s(model, stages, ring, "tensor", 1, position, a)
    return pipeline_step_s(model, stages, ring, 1, position, a)


@dataclass(frozen=True)
class Prefill:
    """The prefill node a placement is ranked and launched with (ranked for agents)."""
    row: SplitRow  # at the longest prompt predicted
    min_tokens: int  # the uncached prompt tokens, less the last, from which it pays

    def launch(self) -> dict[str, Any]:
        """What a launch from the placement adds (LaunchRequest's prefill, prefill_min)."""
        return {"prefill": self.row.node_id, "prefill_min": self.min_tokens}


def best_split(model: ModelSpec, placement: Placement, nodes: Sequence[NodeSpec],
               links: Sequence[LinkSpec], a: Assumptions = DEFAULT) -> Prefill | None:
    """The prefill node that gives the placement's longest predicted prompt its soonest
    first token, where that beats the placement's own, and the prompt length from which
    it does; None where none does."""
    if not placement.prediction.ttft:
        return None
    longest = placement.prediction.ttft[-1][0]
    # a node whose speed is a guess (it hasn't calibrated yet) is never chosen on it
    known = [nd for nd in nodes if not nd.guessed or nd.id == placement.ranks[0].node]
    wins = [r for r in split_rows(model, placement, known, links, [longest], a) if r.pays]
    if not wins:
        return None
    row = min(wins, key=lambda r: (r.split_s, r.node))
    used = {row.node_id, *(r.node for r in placement.ranks)}
    pair = [nd for nd in nodes if nd.id in used]

    def pays(n: int) -> bool:  # (the placement's nodes and the prefill node only)
        return any(r.pays for r in split_rows(model, placement, pair, links, [n], a))

    # The gain needn't grow with the prompt (over a slow link a short prompt can pay, a
    # middling one not, a long one again; prefilling here climbs a chunk at a time), so
    # lengths a fifth apart are tried and the launch's minimum is where the run of them
    # that pays up to the longest starts.
    lengths, n = [], HANDOVER_MIN_TOKENS + 1
    while n < longest:
        lengths.append(n)
        n = n * 6 // 5
    start = longest
    for n in reversed(lengths):
        if not pays(n):
            break
        start = n
    return Prefill(row, max(HANDOVER_MIN_TOKENS, start - 1 - int(start * a.prompt_cached)))


def prefer_split(model: ModelSpec, placements: Sequence[Placement],
                 nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
                 a: Assumptions = DEFAULT) -> list[Placement]:
    """The placements, each with its best prefill node where one pays (Placement.prefill:
    ranked for agents by that time, launched with it)."""
    return [replace(p, prefill=best) if (best := best_split(model, p, nodes, links, a))
            else p for p in placements]


def split_json(model: ModelSpec, placements: Sequence[Placement], nodes: Sequence[NodeSpec],
               links: Sequence[LinkSpec], a: Assumptions = DEFAULT) -> list[dict[str, Any]]:
    """Per placement, what POST /shoal/plan and `shoal plan --json` add to it: "prefill",
    the node id a launch from it names (None: none), "prefill_min", the prompt tokens
    from which it pays (a launch's "prefill_min"), and "split_prefill", each other
    node's SplitRow at each prompt length."""
    prompts = sorted(set(a.ttft_prompts))
    return [{"prefill": p.prefill.row.node_id if p.prefill else None,
             "prefill_min": p.prefill.min_tokens if p.prefill else None,
             "split_prefill": [{**asdict(r), "pays": r.pays}
                               for r in split_rows(model, p, nodes, links, prompts, a)]}
            for p in placements]


def _link(links: Sequence[LinkSpec], a: str, b: str) -> LinkSpec | None:
    return next((k for k in links if {k.a, k.b} == {a, b}), None)


def render_split(rows: Sequence[SplitRow]) -> list[str]:
    """The `shoal plan` lines: each prefill node's times against the placement's own."""
    out: list[str] = []
    for name in dict.fromkeys(r.node for r in rows):
        mine = [r for r in rows if r.node == name]
        cells = "  ".join(f"{_k(r.prompt)}: {r.split_s:.2f} s (alone {r.alone_s:.2f} s, "
                          f"KV {r.kv_bytes / 1e9:.2f} GB in {r.transfer_s:.2f} s)"
                          for r in mine)
        run = []  # the lengths that pay up to the longest
        for r in sorted(mine, key=lambda r: -r.prompt):
            if not r.pays:
                break
            run.append(r.prompt)
        wins = [_k(r.prompt) for r in mine if r.pays]
        verdict = (f"pays from {_k(min(run))} tokens" if run else
                   f"pays at {', '.join(wins)} tokens only" if wins else
                   "doesn't pay at these lengths")
        out.append(f"with prefill on {name}: {verdict}. {cells}")
    return out


def render_choice(choice: Prefill) -> str:
    """The `shoal plan --rank agents` line for a placement ranked with a prefill node."""
    row = choice.row
    return (f"ranked with prefill on {row.node}: first token of a {_k(row.prompt)}-token "
            f"prompt in {row.split_s:.2f} s instead of {row.alone_s:.2f} s; a launch from "
            f"it names \"prefill\": \"{row.node_id}\", \"prefill_min\": "
            f"{choice.min_tokens} (prompts from {choice.min_tokens:,} uncached tokens pay)")


def _k(n: int) -> str:
    return f"{n // 1000}K" if n >= 1000 and n % 1000 == 0 else str(n)
