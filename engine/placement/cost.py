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
from engine.placement.tables import DEFAULT, Assumptions, kv_tokens, table


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


class _Rates:
    """Per-layer sums for one model at one cached position, looked up once per step."""

    def __init__(self, model: ModelSpec, position: int):
        self.model, self.t = model, table(model)
        self.kv = kv_tokens(model, position) if position else None


def _rank_s(r: _Rates, node: NodeSpec, layers: tuple[int, int], head: bool, tokens: int,
            shards: int, a: Assumptions) -> float:
    """One rank's time for `tokens` new tokens over the cached ones."""
    s, e = layers
    model, t = r.model, r.t
    active = (t.active[e] - t.active[s]) / shards
    cached = r.kv[e] - r.kv[s] if r.kv else 0
    kv = cached * model.kv_per_token * model.kv_bytes / (shards if model.kv_sharded else 1)
    head_params = model.head_params if head and tokens == 1 else 0
    if tokens == 1:  # decode: the routed experts only, and the head for the one token
        nbytes = (active + head_params) * model.bytes_per_param + kv
    else:  # a prefill chunk touches nearly every expert; only its last token needs the head
        nbytes = (t.weights[e] - t.weights[s]) / shards * model.bytes_per_param + kv
    flops = 2 * tokens * (active + head_params)
    flops += 2 * tokens * model.heads / shards * model.score_per_head * cached
    moe = t.moe[e] - t.moe[s]
    fixed = moe * a.moe_layer_overhead_s + (e - s - moe) * a.layer_overhead_s
    return max(nbytes / (node.memory_bandwidth_Bps * a.bandwidth_efficiency),
               flops / (node.compute_flops * a.compute_efficiency)) + fixed


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
    active = (t.active[e] - t.active[s]) / shards + (model.head_params if head else 0)
    cached = r.kv[e] - r.kv[s] if r.kv else 0
    kv = cached * model.kv_per_token * model.kv_bytes / (shards if model.kv_sharded else 1)
    # the other sequences route to other experts, up to all of them
    idle = ((t.weights[e] - t.weights[s]) - (t.active[e] - t.active[s])) / shards
    routed = min(1.0, (streams - 1) * model.active_experts / model.experts) \
        if model.experts else 0.0
    nbytes = (active + routed * idle) * model.bytes_per_param + streams * kv
    flops = 2 * streams * (active + model.heads / shards * model.score_per_head * cached)
    moe = t.moe[e] - t.moe[s]
    fixed = moe * a.moe_layer_overhead_s + (e - s - moe) * a.layer_overhead_s
    return max(nbytes / (node.memory_bandwidth_Bps * a.bandwidth_efficiency),
               flops / (node.compute_flops * a.compute_efficiency)) + fixed


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
    return Prediction(decode_tps=one, decode_tps_full=1 / step(1, context),
                      prefill_tps=prompt / prefill, decode_tps_streams=a.streams / round_s,
                      streams=a.streams, lanes=lanes, decode_tps_drafted=drafted,
                      draft_tokens=k)
