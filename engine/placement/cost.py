"""The performance model: seconds per decoded token and per prompt, from bytes, FLOPs,
latencies and bandwidths. Every term is monotone: more bandwidth or compute never makes a
prediction slower, more latency never makes it faster.

Decode reads every active weight once per token (routed experts only, for mixture-of-
experts) plus the KV cache so far, so a rank takes max(bytes / bandwidth, FLOPs / compute)
plus a fixed cost per layer. A pipeline runs its stages one after another for a single
sequence, so their times add, plus one hop per stage boundary and the hop that brings the
token back to rank 0. Tensor parallel ranks run together (the slowest counts) and
all-reduce the hidden state twice per layer. Prefill is the same sum over the prompt's
chunks, where every stored weight is read once per chunk and compute usually dominates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.placement.model import LinkSpec, ModelSpec, NodeSpec
from engine.placement.tables import DEFAULT, Assumptions, LayerTable, kv_tokens, table


@dataclass(frozen=True)
class Stage:
    node: NodeSpec
    layers: tuple[int, int]
    head: bool  # runs the output head (rank 0 of a pipeline)


@dataclass(frozen=True)
class Prediction:
    decode_tps: float  # one sequence, right after a prompt of Assumptions.prefill_tokens
    decode_tps_full: float  # one sequence, with the whole context in the cache
    prefill_tps: float  # a prompt of Assumptions.prefill_tokens tokens
    decode_tps_streams: float = 0.0  # `streams` sequences together, all of them
    streams: int = 1
    lanes: int = 1  # micro-batches a pipeline keeps in flight for them (lanes_round_s)
    decode_tps_drafted: float = 0.0  # one sequence alone, with drafts (0: not predicted)
    draft_tokens: int = 0  # the guesses per pass that prediction assumes
    # time to first token per prompt length that fits the context: (prompt tokens, tokens
    # of it the prefix cache holds, seconds alone, seconds with streams - 1 others decoding)
    ttft: tuple[tuple[int, int, float, float], ...] = ()
    watts: float = 0.0  # every node of it together, where each one's is known (0: not)

    @property
    def decode_j_per_token(self) -> float:
        """Joules per token, one sequence decoding (0: a node's watts are unknown)."""
        return self.watts / self.decode_tps if self.watts and self.decode_tps else 0.0

    def ttft_at(self, prompt: int | None = None) -> float:
        """Seconds to the first token alone at `prompt` (None: the longest predicted);
        infinite where that prompt wasn't predicted (longer than the context)."""
        rows = [r for r in self.ttft if prompt is None or r[0] == prompt]
        return rows[-1][2] if rows else math.inf



def hop_s(link: LinkSpec, nbytes: float) -> float:
    return link.latency_s + nbytes / link.bandwidth_Bps


def allreduce_s(nbytes: float, ring: Sequence[LinkSpec]) -> float:
    """Ring all-reduce over len(ring) ranks: 2(n-1) steps of bytes/n, each paced by the
    slowest link (reduce-scatter, then all-gather)."""
    n = len(ring)
    if n < 2:
        return 0.0
    lat = max(link.latency_s for link in ring)
    bw = min(link.bandwidth_Bps for link in ring)
    return 2 * (n - 1) * (lat + nbytes / n / bw)


def touched(model: ModelSpec, tokens: int) -> float:
    """The share of the experts one token doesn't use that `tokens - 1` others route to
    (each picks `active_experts` of `experts`, independently): 16 tokens of an 8-of-384
    model touch 28% of them, 2048 touch all. 0 for a dense model."""
    if not model.experts or tokens <= 1:
        return 0.0
    return 1 - (1 - model.active_experts / model.experts) ** (tokens - 1)


class _Rates:
    """Per-layer sums for one model at one cached position, looked up once per step."""

    def __init__(self, model: ModelSpec, position: int):
        self.model, self.t = model, table(model)
        self.kv = kv_tokens(model, position) if position else None


def _bpp(r: _Rates, node: NodeSpec, layers: tuple[int, int], shards: int) -> float:
    """Bytes a weight takes as the rank runs it: a CPU node unpacks quantized weights to
    float32 where that copy fits in half its memory (engine/platform/cpu.py), else the
    checkpoint's."""
    bpp = r.model.bytes_per_param
    if node.reads_gguf and r.model.gguf and shards == 1 \
            and layers == (0, r.model.layers):  # alone: llama.cpp reads the file as it is
        return bpp
    if node.unpacks and bpp < 4:
        s, e = layers
        if (r.t.weights[e] - r.t.weights[s]) / shards * 4 <= node.memory_bytes / 2:
            return 4.0
    return bpp


def _sharded(t: LayerTable, xs: tuple[float, ...], s: int, e: int, shards: int) -> float:
    """One rank's share of layers s..e-1 of `xs`: 1/shards of it, but the weights every
    tensor rank keeps whole (MLA's down-projections, routers) count whole."""
    rep = t.replicated[e] - t.replicated[s] if shards > 1 else 0.0
    return (xs[e] - xs[s] - rep) / shards + rep


def _rank_s(r: _Rates, node: NodeSpec, layers: tuple[int, int], head: bool, tokens: int,
            shards: int, a: Assumptions) -> float:
    """One rank's time for `tokens` new tokens over the cached ones."""
    s, e = layers
    model, t = r.model, r.t
    active = _sharded(t, t.active, s, e, shards)
    cached = r.kv[e] - r.kv[s] if r.kv else 0
    kv = cached * model.kv_per_token * model.kv_bytes / (shards if model.kv_sharded else 1)
    head_params = model.head_params if head and tokens == 1 else 0
    # decode reads the routed experts only, and the head for the one token; a prefill
    # chunk also reads the experts its other tokens route to (only its last needs the head)
    idle = ((t.weights[e] - t.weights[s]) - (t.active[e] - t.active[s])) / shards
    nbytes = (active + head_params + touched(model, tokens) * idle) * _bpp(r, node, layers,
                                                                          shards) \
        + kv
    flops = 2 * tokens * (active + head_params)
    # a chunk's tokens attend to what is cached and, causally, to half the chunk
    scores = cached + ((e - s) * (tokens + 1) / 2 if tokens > 1 else 0)
    attention = 2 * tokens * model.heads / shards * model.score_per_head * scores
    moe = t.moe[e] - t.moe[s]
    fixed = moe * a.moe_layer_overhead_s + (e - s - moe) * a.layer_overhead_s
    rate = prefill_rate(node, model.hidden) if tokens > 1 else 0.0
    return max(nbytes / (node.memory_bandwidth_Bps * a.bandwidth_efficiency),
               compute_s(node, flops, attention, a, rate)) + fixed


def prefill_rate(node: NodeSpec, hidden: int) -> float:
    """The FLOP/s a prefill chunk's matmuls get on `node` for a model `hidden` wide: its
    measured decoder layers' rates, interpolated in log(width) and held at the ends; 0
    where it measured none."""
    pts = node.prefill_flops
    if not pts:
        return 0.0
    if hidden <= pts[0][0] or len(pts) == 1:
        return pts[0][1]
    for (w0, r0), (w1, r1) in zip(pts, pts[1:]):
        if hidden <= w1:
            f = math.log(hidden / w0) / math.log(w1 / w0)
            return r0 + f * (r1 - r0)
    return pts[-1][1]


def compute_s(node: NodeSpec, flops: float, attention: float, a: Assumptions,
              rate: float = 0.0) -> float:
    """Matmul FLOPs at `rate` (0: the node's matmul rate), attention's at its own."""
    rate = rate or node.compute_flops * a.compute_efficiency
    return flops / rate + attention / (node.attention_flops or
                                       node.compute_flops * a.compute_efficiency)


def pipeline_step_s(model: ModelSpec, stages: Sequence[Stage], ring: Sequence[LinkSpec],
                    tokens: int, position: int, a: Assumptions = DEFAULT) -> float:
    """Stages one after another, `ring[i]` joining stage i to i+1 (the last one brings
    the last position's hidden state back to rank 0, which runs the head)."""
    r = _Rates(model, position)
    total = sum(_rank_s(r, st.node, st.layers, st.head, tokens, 1, a) for st in stages)
    if len(stages) > 1:
        act = tokens * model.hidden * a.act_bytes
        total += sum(hop_s(link, act) for link in ring[:len(stages) - 1])
        total += hop_s(ring[len(stages) - 1], model.hidden * a.act_bytes)
    return total


def tensor_step_s(model: ModelSpec, nodes: Sequence[NodeSpec], ring: Sequence[LinkSpec],
                  tokens: int, position: int, a: Assumptions = DEFAULT) -> float:
    """All ranks together on 1/n of every layer; two all-reduces per layer."""
    n, r = len(nodes), _Rates(model, position)
    compute = max(_rank_s(r, nd, (0, model.layers), True, tokens, n, a) for nd in nodes)
    comms = 2 * model.layers * allreduce_s(tokens * model.hidden * a.act_bytes, ring)
    return compute + comms


def _batched_rank_s(r: _Rates, node: NodeSpec, layers: tuple[int, int], head: bool,
                    streams: int, shards: int, a: Assumptions) -> float:
    """One rank decoding `streams` sequences in one step (continuous batching): its
    weights are read once for all of them (for MoE, every expert some sequence routes
    to), every sequence's KV and FLOPs are its own; the step is paced by the larger of
    memory and compute, as a single token's is."""
    if streams <= 1:
        return _rank_s(r, node, layers, head, 1, shards, a)
    s, e = layers
    model, t = r.model, r.t
    active = _sharded(t, t.active, s, e, shards) + (model.head_params if head else 0)
    cached = r.kv[e] - r.kv[s] if r.kv else 0
    kv = cached * model.kv_per_token * model.kv_bytes / (shards if model.kv_sharded else 1)
    # the other sequences route to other experts, up to all of them
    idle = ((t.weights[e] - t.weights[s]) - (t.active[e] - t.active[s])) / shards
    nbytes = (active + touched(model, streams) * idle) * _bpp(r, node, layers, shards) \
        + streams * kv
    attention = 2 * streams * model.heads / shards * model.score_per_head * cached
    moe = t.moe[e] - t.moe[s]
    fixed = moe * a.moe_layer_overhead_s + (e - s - moe) * a.layer_overhead_s
    return max(nbytes / (node.memory_bandwidth_Bps * a.bandwidth_efficiency),
               compute_s(node, 2 * streams * active, attention, a)) + fixed


def batched_step_s(model: ModelSpec, stages: Sequence[Stage], ring: Sequence[LinkSpec],
                   strategy: str, streams: int, position: int,
                   a: Assumptions = DEFAULT) -> float:
    """One decode step of `streams` sequences together, on one node or a group (a group
    batches as one node does: every rank runs the whole batch, then passes it on)."""
    r = _Rates(model, position)
    act = streams * model.hidden * a.act_bytes
    if strategy == "tensor":
        n = len(stages)
        compute = max(_batched_rank_s(r, st.node, (0, model.layers), True, streams, n, a)
                      for st in stages)
        return compute + 2 * model.layers * allreduce_s(act, ring)
    total = sum(_batched_rank_s(r, st.node, st.layers, st.head, streams, 1, a)
                for st in stages)
    if len(stages) > 1:
        total += sum(hop_s(link, act) for link in ring[:len(stages)])
    return total


def lanes_round_s(model: ModelSpec, stages: Sequence[Stage], ring: Sequence[LinkSpec],
                  streams: int, lanes: int, position: int, a: Assumptions = DEFAULT) -> float:
    """One decode step of every one of `streams` sequences on a pipeline that splits them
    into `lanes` micro-batches in flight: while one rank runs one lane the others run the
    others, so the busiest rank paces the round (each lane a step of its own, weights read
    again), and no lane comes round faster than the stages one after another. It pays where
    a step's cost grows with its batch: experts routed to, FLOPs, KV."""
    r = _Rates(model, position)
    per = math.ceil(streams / lanes)
    act = per * model.hidden * a.act_bytes
    ranks = [_batched_rank_s(r, st.node, st.layers, st.head, per, 1, a) for st in stages]
    hops = [hop_s(link, act) for link in ring[:len(stages)]]
    return max(min(lanes, streams) * max(t + h for t, h in zip(ranks, hops)),
               sum(ranks) + sum(hops))


def pipeline_lanes(model: ModelSpec, stages: Sequence[Stage], ring: Sequence[LinkSpec],
                   streams: int, position: int, a: Assumptions = DEFAULT) -> tuple[int, float]:
    """(lanes, seconds per round of `streams` sequences): a lane per stage where that is
    predicted at least 5% faster than one batch going stage after stage (the rest is
    overhead the model doesn't count: more steps, more messages), else one."""
    one = batched_step_s(model, stages, ring, "pipeline", streams, position, a)
    if len(stages) < 2 or streams < 2:
        return 1, one
    many = lanes_round_s(model, stages, ring, streams, len(stages), position, a)
    return (len(stages), many) if many < 0.95 * one else (1, one)


def drafted_tps(step: Callable[[int], float], a: Assumptions = DEFAULT) -> tuple[float, int]:
    """(decode tokens/s with drafts, guesses per pass) for a pass costing step(tokens):
    k guesses each kept with probability alpha give (1 - alpha^(k+1)) / (1 - alpha)
    tokens per pass of k + 1 tokens; the best k, or none where no k beats one token."""
    alpha = min(max(a.draft_acceptance, 0.0), 0.999)
    best, k_best = 1 / step(1), 0
    for k in range(1, a.draft_tokens + 1):
        rate = (1 - alpha ** (k + 1)) / (1 - alpha) / step(k + 1)
        if rate > best:
            best, k_best = rate, k
    return best, k_best


def chunk_tokens(step: Callable[[int], float], target_s: float,
                 a: Assumptions = DEFAULT) -> int:
    """The prefill chunk the serving node settles on (engine/runtime/chunking.py): as many
    tokens as its last chunk's rate fills `target_s` with, 16 to 2048. A small chunk reads
    every weight for few tokens, so the rate is found twice from the top."""
    tokens = a.prefill_chunk
    for _ in range(2):
        want = int(tokens / step(tokens) * target_s) // 16 * 16
        tokens = max(16, min(a.prefill_chunk, want))
    return tokens


def ttft_s(model: ModelSpec, strategy: str, stages: Sequence[Stage],
           ring: Sequence[LinkSpec], prompt: int, cached: int = 0, busy: int = 0,
           overlap: bool = True, a: Assumptions = DEFAULT) -> float:
    """Seconds from a request to its first token: the `prompt - cached` tokens the prefix
    cache doesn't hold, in chunks that each attend to everything before them, then the
    last token's step through the head. `busy` other sequences decoding ride in every
    chunk's step (their tokens join the chunk). With `overlap` a pipeline's chunks flow
    through its stages as in a flow shop (rank 1 on chunk i while rank 0 runs chunk i+1):
    the busiest stage paces the chunks and the others add their share of the last one;
    without it (lockstep, tensor, one node) every chunk crosses every rank in turn."""
    cached = max(0, min(cached, prompt - 1))
    new = prompt - 1 - cached
    multi = strategy != "tensor" and len(stages) > 1
    nodes = [s.node for s in stages]
    # tensor ranks run alike: each distinct machine once is enough to find the slowest
    kinds = list({(nd.memory_bandwidth_Bps, nd.compute_flops, nd.attention_flops,
                   nd.prefill_flops, nd.unpacks, nd.memory_bytes): nd
                  for nd in nodes}.values())

    def stage_times(tokens: int, position: int) -> list[float]:
        r = _Rates(model, position)
        if strategy == "tensor":
            comms = 2 * model.layers * allreduce_s(tokens * model.hidden * a.act_bytes, ring)
            return [max(_rank_s(r, nd, (0, model.layers), True, tokens, len(nodes), a)
                        for nd in kinds) + comms]
        act = tokens * model.hidden * a.act_bytes
        return [_rank_s(r, st.node, st.layers, False, tokens, 1, a)
                + (hop_s(ring[i], act) if multi and i < len(stages) - 1 else 0.0)
                for i, st in enumerate(stages)]

    if new <= 0:
        total = 0.0
    else:
        pace = (lambda ts: max(ts)) if overlap and multi else sum
        target = a.chunk_busy_s if busy else a.chunk_alone_s
        chunk = chunk_tokens(lambda t: pace(stage_times(t + busy, cached)), target, a)
        if overlap and multi and not busy:  # chunks enough to keep every stage busy
            chunk = min(chunk, max(16, -(-new // (8 * len(stages) * 16)) * 16))
        chunks = math.ceil(new / chunk)
        # weigh the chunks at 4 points along the prompt, not one by one: a chunk's time
        # grows linearly with its position (KV read, attention), so midpoints are exact
        # but where memory and compute trade places
        points = min(chunks, 4)
        total, last = 0.0, [0.0]
        for k in range(points):
            first, upto = chunks * k // points, chunks * (k + 1) // points
            mid = cached + (first + upto) * chunk // 2
            times = stage_times(chunk + busy, min(mid, prompt))
            total += (upto - first) * pace(times)
            last = times
        if overlap and multi:  # the drain: the stages after the busiest one, last chunk
            total += sum(last[last.index(max(last)) + 1:])
    lead = pipeline_step_s(model, stages, ring, 1, prompt, a) if strategy != "tensor" \
        else tensor_step_s(model, nodes, ring, 1, prompt, a)
    return total + lead


def predict(model: ModelSpec, strategy: str, stages: Sequence[Stage],
            ring: Sequence[LinkSpec], context: int, a: Assumptions = DEFAULT) -> Prediction:
    """Decode and prefill tokens/s for a pipeline (or single node) or tensor placement."""
    def step(tokens: int, position: int) -> float:
        if strategy == "tensor":
            return tensor_step_s(model, [s.node for s in stages], ring, tokens, position, a)
        return pipeline_step_s(model, stages, ring, tokens, position, a)

    prompt = min(a.prefill_tokens, context)
    chunk = min(a.prefill_chunk, prompt)
    chunks = math.ceil(prompt / chunk)
    # each chunk attends to what came before it: on average half the prompt
    prefill = chunks * step(chunk, prompt // 2)
    one = 1 / step(1, prompt)
    if strategy == "tensor":
        lanes, round_s = 1, batched_step_s(model, stages, ring, strategy, a.streams, prompt, a)
    else:
        lanes, round_s = pipeline_lanes(model, stages, ring, a.streams, prompt, a)
    # a pass verifying k guesses costs as k + 1 sequences' step in a batch: weights read
    # once, the experts the tokens route to, the head and FLOPs per token, one trip round
    # a group (its KV is counted per token too: read once in truth, a slight overestimate);
    # with a draft model on rank 0's node, each guess also costs one of its steps
    lead = stages[0].node
    draft_s = lead.draft_bytes / (lead.memory_bandwidth_Bps * a.bandwidth_efficiency) \
        if lead.draft_bytes and lead.memory_bandwidth_Bps else 0.0
    drafted, k = drafted_tps(lambda tokens: batched_step_s(
        model, stages, ring, strategy, tokens, prompt, a) + (tokens - 1) * draft_s, a)
    overlap = strategy == "pipeline" and a.streams > 1  # the batching group's prefill
    ttft = tuple((n, int(n * a.prompt_cached),
                  ttft_s(model, strategy, stages, ring, n, int(n * a.prompt_cached), 0,
                         overlap, a),
                  ttft_s(model, strategy, stages, ring, n, int(n * a.prompt_cached),
                         a.streams - 1, overlap, a))
                 for n in sorted(set(a.ttft_prompts)) if n <= context)
    return Prediction(decode_tps=one, decode_tps_full=1 / step(1, context),
                      prefill_tps=prompt / prefill, decode_tps_streams=a.streams / round_s,
                      streams=a.streams, lanes=lanes, decode_tps_drafted=drafted,
                      draft_tokens=k, ttft=ttft,
                      watts=sum(s.node.watts for s in stages)
                      if all(s.node.watts for s in stages) else 0.0)
