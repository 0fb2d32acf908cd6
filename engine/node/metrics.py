"""The figures of the requests this node serves, kept once: each finished request becomes
one FinishedRequest, which feeds both /metrics (Prometheus' text format, vLLM's names where
the meaning is the same) and GET /shoal/finished (the app's charts). Live figures (requests
running and waiting, memory, watts) are read when /metrics is scraped.

A node counts only the requests it serves itself (a relayed one is counted by the node that
owns the model's instance), so a Prometheus operator scrapes every node."""

from __future__ import annotations

import itertools
import math
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine import protocol as wire
from engine.records import Record

KEEP = 1000  # finished requests GET /shoal/finished can list
LABELS = ("model_name", "node")
FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's FINISH_REASON_STRINGS
# vLLM's buckets (vllm/v1/metrics/loggers.py), so its dashboards' quantiles mean the same
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
COUNT_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))  # 1 .. 5M


@dataclass(frozen=True)
class FinishedRequest(Record):
    """One request this node served, as it ended (GET /shoal/finished lists them)."""
    seq: int  # this node's count, so a reader can tell what it has seen
    at: float  # unix time it ended
    node: str
    model: str
    finish_reason: str  # vLLM's: stop | length | abort | error
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens read from the prefix cache
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    queue_s: float = 0.0  # waiting for a turn
    ttft_s: float | None = None  # from arrival to the first token
    e2e_s: float = 0.0
    generation_tps: float | None = None  # the worker's decode speed
    prompt_tps: float | None = None


def _speed(v: float) -> float | None:
    return round(v, 2) if v > 0 and math.isfinite(v) else None


class Tracker:
    """One request's events as they pass (WorkerHandle feeds them): when it got its turn,
    its first token, the gaps between outputs, how it ended."""

    def __init__(self, metrics: NodeMetrics, model: str):
        self.metrics, self.model = metrics, model
        self.arrived = self.turn = time.monotonic()
        self.first: float | None = None
        self.last: float | None = None
        self.prompt_tokens = 0
        self.done: wire.Done | None = None
        self.failed = False
        self.ended = False

    def begin(self) -> None:
        """It got its turn (it waited until now)."""
        self.turn = time.monotonic()

    def see(self, ev: Any) -> None:
        now = time.monotonic()
        if isinstance(ev, wire.Accepted):
            self.prompt_tokens = ev.prompt_tokens
        elif isinstance(ev, (wire.Delta, wire.ToolCall)):
            if self.first is None:
                self.first = now
                self.metrics.first_token(self.model, now - self.arrived)
            elif self.last is not None:
                self.metrics.token_gap(self.model, now - self.last)
            self.last = now
        elif isinstance(ev, wire.Done):
            self.done = ev
        elif isinstance(ev, wire.Error):
            self.failed = True

    def end(self) -> FinishedRequest | None:
        """It ended (once): its figures, recorded."""
        if self.ended:
            return None
        self.ended = True
        d, now = self.done, time.monotonic()
        reason = "error" if self.failed else "abort" if d is None else \
            {"stop": "stop", "tool_calls": "stop", "length": "length"}.get(d.finish_reason,
                                                                           "abort")
        fig = FinishedRequest(
            seq=0, at=round(time.time(), 3), node=self.metrics.node, model=self.model,
            finish_reason=reason,
            prompt_tokens=d.prompt_tokens if d else self.prompt_tokens,
            generation_tokens=d.generation_tokens if d else 0,
            cached_tokens=d.cached_tokens if d else 0,
            drafted_tokens=d.drafted_tokens if d else 0,
            accepted_tokens=d.accepted_tokens if d else 0,
            queue_s=round(self.turn - self.arrived, 4),
            ttft_s=None if self.first is None else round(self.first - self.arrived, 4),
            e2e_s=round(now - self.arrived, 4),
            generation_tps=_speed(d.generation_tps) if d else None,
            prompt_tps=_speed(d.prompt_tps) if d else None)
        decode = (self.last - self.first) if self.first is not None and self.last else 0.0
        return self.metrics.record(fig, decode)


class NodeMetrics:
    """This node's counters, in a registry of its own (not prometheus_client's global one:
    tests run several nodes in one process)."""

    def __init__(self, node: str = "", keep: int = KEEP):
        self.node = node or socket.gethostname() or "node"
        self.registry = CollectorRegistry()
        self.finished: deque[FinishedRequest] = deque(maxlen=keep)
        self._seq = itertools.count(1)
        self._models: set[str] = set()
        # set by the node: (model, running, waiting) of its worker, and its machine's facts
        self.live: Callable[[], tuple[str, int, int] | None] = lambda: None
        self.facts: Callable[[], Any] = lambda: None
        # set by a node in a cluster: ((model, replica's node, why), requests) it routed
        self.routes: Callable[[], list[tuple[tuple[str, str, str], int]]] = lambda: []
        r, lb = self.registry, LABELS

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*lb, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS
                      ) -> Histogram:
            return Histogram(name, doc, lb, buckets=buckets, registry=r)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.")
        self.success = counter("vllm:request_success", "Count of finished requests.",
                               ("finished_reason",))
        self.cache_queries = counter("vllm:prefix_cache_queries",
                                     "Prefix cache queries, in terms of number of queried tokens.")
        self.cache_hits = counter("vllm:prefix_cache_hits",
                                  "Prefix cache hits, in terms of number of cached tokens.")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                    "Number of draft tokens.")
        self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens",
                                       "Number of accepted tokens.")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", TOKEN_BUCKETS)
        # vLLM's older name for the same figure, which many dashboards still read
        self.itl_old = histogram("vllm:time_per_output_token_seconds",
                                 "Histogram of time per output token in seconds.",
                                 TOKEN_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.",
                              TOKEN_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.")
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.")
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.")
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.")
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.")
        self.prompt_sizes = histogram("vllm:request_prompt_tokens",
                                      "Number of prefill tokens processed.", COUNT_BUCKETS)
        self.answer_sizes = histogram("vllm:request_generation_tokens",
                                      "Number of generation tokens processed.", COUNT_BUCKETS)
        r.register(_Live(self))

    def start(self, model: str) -> Tracker:
        """A request for `model` arrived."""
        self._seen(model)
        return Tracker(self, model)

    def _seen(self, model: str) -> None:
        """A model's series start at zero from its first request (a dashboard's rate() sees
        the first one too), every finish reason included."""
        if model in self._models:
            return
        self._models.add(model)
        for c in (self.prompt_tokens, self.generation_tokens, self.cache_queries,
                  self.cache_hits, self.draft_tokens, self.accepted_tokens, self.ttft,
                  self.itl, self.itl_old, self.tpot, self.e2e, self.queue, self.inference,
                  self.prefill, self.decode, self.prompt_sizes, self.answer_sizes):
            c.labels(model, self.node)
        for reason in FINISH_REASONS:
            self.success.labels(model, self.node, reason)

    def first_token(self, model: str, seconds: float) -> None:
        self.ttft.labels(model, self.node).observe(seconds)

    def token_gap(self, model: str, seconds: float) -> None:
        self.itl.labels(model, self.node).observe(seconds)
        self.itl_old.labels(model, self.node).observe(seconds)

    def record(self, fig: FinishedRequest, decode_s: float = 0.0) -> FinishedRequest:
        """The one place a finished request's figures are counted: /metrics' counters and
        the list the app's charts read."""
        from dataclasses import replace
        fig = replace(fig, seq=next(self._seq), node=self.node)
        m = (fig.model, self.node)
        self._seen(fig.model)
        self.prompt_tokens.labels(*m).inc(fig.prompt_tokens)
        self.generation_tokens.labels(*m).inc(fig.generation_tokens)
        self.success.labels(*m, fig.finish_reason).inc()
        if fig.prompt_tokens:  # a request that never got its prompt read queried nothing
            self.cache_queries.labels(*m).inc(fig.prompt_tokens)
            self.cache_hits.labels(*m).inc(min(fig.cached_tokens, fig.prompt_tokens))
        self.draft_tokens.labels(*m).inc(fig.drafted_tokens)
        self.accepted_tokens.labels(*m).inc(fig.accepted_tokens)
        self.e2e.labels(*m).observe(fig.e2e_s)
        self.queue.labels(*m).observe(fig.queue_s)
        self.inference.labels(*m).observe(max(0.0, fig.e2e_s - fig.queue_s))
        if fig.ttft_s is not None:  # prefill: from its turn to its first token
            self.prefill.labels(*m).observe(max(0.0, fig.ttft_s - fig.queue_s))
            self.decode.labels(*m).observe(decode_s)
        self.prompt_sizes.labels(*m).observe(fig.prompt_tokens)
        self.answer_sizes.labels(*m).observe(fig.generation_tokens)
        if fig.generation_tokens > 1 and decode_s > 0:
            self.tpot.labels(*m).observe(decode_s / (fig.generation_tokens - 1))
        self.finished.append(fig)
        return fig

    def recent(self, since: float = 0.0) -> list[FinishedRequest]:
        """The finished requests that ended after `since` (unix time)."""
        return [f for f in self.finished if f.at > since]


class _Live(Collector):
    """What is true now, read at each scrape: the worker's requests running and waiting
    (what GET /shoal/status says too), the machine's memory and watts."""

    def __init__(self, metrics: NodeMetrics):
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        m = self.metrics
        running = GaugeMetricFamily("vllm:num_requests_running",
                                    "Number of requests in model execution batches.",
                                    labels=LABELS)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting",
                                    "Number of requests waiting to be processed.",
                                    labels=LABELS)
        live = m.live()
        for model in sorted(m._models | ({live[0]} if live else set())):
            now = live if live and live[0] == model else (model, 0, 0)
            running.add_metric([model, m.node], now[1])
            waiting.add_metric([model, m.node], now[2])
        yield running
        yield waiting
        routed = CounterMetricFamily(
            "shoal_routed_requests", "Requests this node sent to each replica of a model "
            "(why: prefix, the conversation's replica; load, the least loaded; only, the "
            "one replica).", labels=["model", "node", "replica", "why"])
        for (model, replica, why), n in sorted(m.routes()):
            routed.add_metric([model, m.node, replica, why], n)
        yield routed
        yield from _machine(m.node, m.facts())


def _machine(node: str, facts: Any) -> Iterator[GaugeMetricFamily]:
    """shoal_* gauges of what vLLM has no name for: this machine's memory and power."""
    machine = getattr(facts, "machine", None)
    memory = getattr(machine, "memory", None)
    for name, doc, value in (
            ("shoal_memory_total_bytes", "This machine's memory.",
             getattr(memory, "total_bytes", None)),
            ("shoal_memory_available_bytes",
             "Memory a model may use on this machine (within --memory-limit).",
             getattr(memory, "available_bytes", None)),
            ("shoal_power_watts", "What this machine draws now, where it measures it.",
             getattr(getattr(facts, "power", None), "watts", None))):
        if value is not None:
            g = GaugeMetricFamily(name, doc, labels=["node"])
            g.add_metric([node], float(value))
            yield g
