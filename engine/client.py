"""The one way the GUI, the CLI and tests talk to a node: HTTP + server-sent events.

Kept light (httpx only) so the window can import it without pulling in mlx.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from engine.cluster_records import PlanInfo, TopologyInfo
from engine.errors import PeerUnreachable, ShoalError
from engine.records import (
    CatalogInfo,
    ClusterInfo,
    DownloadInfo,
    HealthInfo,
    InstanceInfo,
    LaunchedReplicas,
    ModelCard,
    PeerInfo,
    RemovedInfo,
    ReplicaInfo,
    ReplicasInfo,
    RequestInfo,
    StatusInfo,
)


@dataclass(frozen=True)
class ChatDelta:
    """One piece of a streamed answer. Exactly one delta of a stream has finish_reason set;
    the last one carries usage and the node's speed figures (shoal)."""

    text: str = ""
    reasoning: str = ""  # a reasoning model's thinking, apart from its answer
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    shoal: dict[str, float] = field(default_factory=dict)
    # while the prompt prefills: (tokens from the prefix cache, done, total)
    prefill: tuple[int, int, int] | None = None


class ChatStream:
    """Iterate to receive ChatDelta records; close() stops the generation on the node
    (the node notices the closed connection and cancels within one token)."""

    def __init__(self, client: httpx.Client, request: httpx.Request):
        self._client = client
        try:
            self._response = client.send(request, stream=True)
        except httpx.HTTPError as e:
            raise PeerUnreachable(f"Can't reach the node at {request.url}: {e}") from e
        if self._response.status_code >= 400:
            body = self._response.read()
            self._response.close()
            raise _error_from(self._response.status_code, body)
        self._closed = False

    def __iter__(self) -> Iterator[ChatDelta]:
        try:
            for data in _sse_data(self._response, progress=True):
                if data.startswith(PROGRESS):
                    cached, done, total = (int(x) for x in data[len(PROGRESS):].split())
                    yield ChatDelta(prefill=(cached, done, total))
                    continue
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise ShoalError.from_openai(chunk, 500)
                yield _delta_from_chunk(chunk)
        except httpx.HTTPError as e:
            if not self._closed:
                raise PeerUnreachable(f"The node closed the stream: {e}") from e
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._response.close()


class NodeClient:
    """A node's HTTP API. Every call has a timeout; errors come back as ShoalError."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def retarget(self, base_url: str, api_key: str | None) -> None:
        """Reach the node at another address or with another key (the app's node was
        restarted with new API settings); every view sharing this client follows."""
        old, self.base_url = self._http, base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers,
                                  timeout=old.timeout)
        old.close()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plain JSON calls -------------------------------------------------------------
    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise PeerUnreachable(f"Can't reach the node at {self.base_url}: {e}") from e
        if r.status_code >= 400:
            raise _error_from(r.status_code, r.content)
        return r.json() if r.content else None

    def health(self) -> HealthInfo:
        return HealthInfo.from_json(self._call("GET", "/health"))

    def status(self) -> StatusInfo:
        """state (idle|loading|generating|error), model, error, runner, streams, cluster..."""
        return StatusInfo.from_json(self._call("GET", "/shoal/status"))

    def models(self) -> list[ModelCard]:
        """The models the node serves: those on its disk and those of instances that
        other nodes run (GET /v1/models, OpenAI's model objects)."""
        return [ModelCard.from_json(m) for m in self._call("GET", "/v1/models")["data"]]

    def requests(self, since: float = 0.0) -> list[RequestInfo]:
        """The node's recent API requests after `since` (unix time), oldest first."""
        found = self._call("GET", "/shoal/requests", params={"since": since})["requests"]
        return [RequestInfo.from_json(e) for e in found]

    def finished(self, since: float = 0.0, peers: bool = False) -> list[dict[str, Any]]:
        """The requests the node (with `peers`, also its trusted peers) served that ended
        after `since` (unix time), each with its figures (tokens, time to first token,
        speed): what /metrics counts, as engine/node/metrics.py's FinishedRequest JSON."""
        params: dict[str, Any] = {"since": since, **({"peers": 1} if peers else {})}
        return self._call("GET", "/shoal/finished", params=params)["requests"]

    def load(self, model: str) -> StatusInfo:
        """Start loading a model in the node's worker; returns the status at once (watch
        it for the load's progress)."""
        return StatusInfo.from_json(self._call("POST", "/shoal/load", json={"model": model}))

    def unload(self) -> StatusInfo:
        """Unload the node's model; the status after."""
        return StatusInfo.from_json(self._call("POST", "/shoal/unload"))

    def shutdown(self) -> None:
        """Ask the node to stop (it stops its workers first). Only honoured from loopback."""
        self._call("POST", "/shoal/shutdown")

    # --- settings kept in the node's home (clients on its machine only) -----------------
    def cluster_secret(self, rotate: bool = False) -> dict[str, str]:
        """{"secret", "pairing", "where"}; `rotate` stores a new secret first (the node
        uses it from its next start)."""
        return self._call("POST", "/shoal/settings/secret",
                          json={"rotate": True} if rotate else {})

    def set_hf_token(self, token: str) -> str:
        """Check a Hugging Face token with the Hub and store it; what to tell the user."""
        return self._call("POST", "/shoal/settings/hf-token", json={"token": token})["message"]

    # --- cluster --------------------------------------------------------------------------
    def topology(self) -> TopologyInfo:
        """Every node this one knows (itself first, with "self": true) with its machine,
        platform and power facts, every measured link, and the Thunderbolt cables."""
        return TopologyInfo.from_json(self._call("GET", "/shoal/topology"))

    def peers(self) -> list[PeerInfo]:
        return [PeerInfo.from_json(p) for p in self._call("GET", "/shoal/peers")]

    def add_peer(self, address: str) -> PeerInfo:
        """Tell the node about another node at host:port (its cluster port); remembered."""
        return PeerInfo.from_json(self._call("POST", "/shoal/peers", json={"address": address}))

    def plan(self, model: str, context: int | None = None, strategy: str | None = None,
             nodes: list[dict[str, Any]] | None = None, backend: str | None = None,
             force: bool = False, kv_bits: int | None = None,
             rank: str | None = None, users: int | None = None) -> PlanInfo:
        """Ranked placements for `model` on the live cluster; with `strategy` and `nodes`
        ([{"node": id, "layers"?: [start, end]}, ...], rank 0 first) the prediction for
        that one placement, or a ShoalError saying why it can't run. `kv_bits` (16, 8,
        4; None: the node's setting) sizes the KV cache; `rank` ("chat", "agents",
        "drafted") orders the placements; `users` (1-256) adds the comparison of
        replicas against one instance for that many people at once."""
        body: dict[str, Any] = {"model": model}
        if users:
            body["users"] = users
        if rank:
            body["rank"] = rank
        if kv_bits:
            body["kv_bits"] = kv_bits
        if context:
            body["context"] = context
        if strategy:
            body["strategy"], body["nodes"] = strategy, nodes or []
            if backend:
                body["backend"] = backend
        if force:
            body["force"] = True
        return PlanInfo.from_json(self._call("POST", "/shoal/plan", json=body))

    def instances(self) -> ClusterInfo:
        """This node's distributed instances and the ranks it runs for other owners."""
        return ClusterInfo.from_json(self._call("GET", "/shoal/instances"))

    def launch(self, model: str, strategy: str, nodes: list[dict[str, Any]],
               backend: str = "ring", timeout: float | None = 900.0,
               force: bool = False, kv_bits: int | None = None,
               replicas: int = 1, prefill: str | None = None,
               prefill_min: int | None = None) -> InstanceInfo | LaunchedReplicas:
        """Start a model over several nodes; returns when every rank has loaded (or raises
        a ShoalError naming the node that failed). `force`: past the memory check;
        `kv_bits`: the KV cache's (None: the node's setting); `replicas` above 1: that many
        copies of it, answered as LaunchedReplicas (each copy's instance, in order);
        `prefill`: a node that prefills its prompts of `prefill_min` tokens or more."""
        answer = self._call("POST", "/shoal/instances", json={
            "model": model, "strategy": strategy, "backend": backend, "nodes": nodes,
            **({"force": True} if force else {}),
            **({"kv_bits": kv_bits} if kv_bits else {}),
            **({"prefill": prefill} if prefill else {}),
            **({"prefill_min": prefill_min} if prefill and prefill_min else {}),
            **({"replicas": replicas} if replicas > 1 else {})}, timeout=timeout)
        if replicas > 1:
            return _record(LaunchedReplicas, answer, "/shoal/instances")
        return InstanceInfo.from_json(answer)

    def replicas(self) -> ReplicasInfo:
        """Every replica of every model this node can route to, with its load and its
        share of the requests this node routed (GET /shoal/replicas). An answer of
        another shape raises a ShoalError, so views never draw half a record."""
        route = "/shoal/replicas"
        try:
            info = _record(ReplicasInfo, self._call("GET", route), route)
        except ValueError as e:  # not JSON at all
            raise _malformed(route, str(e)) from e
        for r in info.replicas:
            if not _sane(r):
                raise _malformed(route, f"a replica reads {r.to_json()!r:.200}")
        return info

    def stop_copy(self, model: str, node: str) -> ReplicaInfo:
        """Stop the copy of `model` that `node` answers for (a row of replicas()),
        wherever it runs; the other copies serve on (POST /shoal/replicas/stop)."""
        route = "/shoal/replicas/stop"
        return _record(ReplicaInfo, self._call("POST", route, json={
            "model": model, "node": node}, timeout=60.0), route)

    def stop_instance(self, instance_id: str) -> InstanceInfo:
        return InstanceInfo.from_json(
            self._call("DELETE", f"/shoal/instances/{instance_id}", timeout=60.0))

    # --- models from the Hub (404 from a node without the hub routes) ----------------------
    def hub_catalog(self) -> CatalogInfo:
        """The curated catalog and the models on disk here and on the other nodes."""
        return CatalogInfo.from_json(self._call("GET", "/shoal/hub/catalog", timeout=30.0))

    def hub_search(self, query: str) -> CatalogInfo:
        """The catalog and the models on disk matching `query`, and the Hub's MLX models."""
        return CatalogInfo.from_json(
            self._call("GET", "/shoal/hub/search", params={"q": query}, timeout=30.0))

    def hub_pull(self, repo: str, revision: str | None = None) -> DownloadInfo:
        body = {"repo": repo, **({"revision": revision} if revision else {})}
        return DownloadInfo.from_json(self._call("POST", "/shoal/hub/pull", json=body))

    def hub_downloads(self) -> list[DownloadInfo]:
        return [DownloadInfo.from_json(d) for d in self._call("GET", "/shoal/hub/downloads")]

    def hub_cancel(self, download_id: str) -> DownloadInfo:
        return DownloadInfo.from_json(
            self._call("DELETE", f"/shoal/hub/downloads/{download_id}"))

    def remove_model(self, model_id: str) -> RemovedInfo:
        return RemovedInfo.from_json(self._call("DELETE", f"/shoal/models/{model_id}"))

    def events(self, timeout: float = 30.0) -> Iterator[StatusInfo]:
        """Status snapshots as they change (server-sent events). Blocks; run off the GUI
        thread. The node sends a keep-alive at least every 10 s, so a silent node for
        `timeout` seconds raises PeerUnreachable."""
        try:
            with self._http.stream("GET", "/shoal/events",
                                   timeout=httpx.Timeout(10.0, read=timeout)) as r:
                for data in _sse_data(r):
                    yield StatusInfo.from_json(json.loads(data))
        except httpx.HTTPError as e:
            raise PeerUnreachable(f"Lost the node's event stream: {e}") from e

    # --- chat ---------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, Any]], model: str | None = None,
             continue_final: bool = False, **params: Any) -> ChatStream:
        """Stream a chat completion. params are OpenAI's (max_tokens, temperature, ...);
        a message's content may be OpenAI content parts (text, image_url with a data URL).
        continue_final: the last message is the assistant's unfinished answer, which the
        model goes on with (vLLM's continue_final_message)."""
        body = {"messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **params}
        if continue_final:
            body |= {"continue_final_message": True, "add_generation_prompt": False}
        if model:
            body["model"] = model
        req = self._http.build_request("POST", "/v1/chat/completions", json=body,
                                       timeout=httpx.Timeout(10.0, read=None))
        return ChatStream(self._http, req)

    def complete(self, messages: list[dict[str, str]], model: str | None = None,
                 **params: Any) -> dict[str, Any]:
        """A non-streaming chat completion; returns the OpenAI response body."""
        body = {"messages": messages, **params}
        if model:
            body["model"] = model
        return self._call("POST", "/v1/chat/completions", json=body, timeout=None)


PROGRESS = ": shoal-progress "


def _sse_data(response: httpx.Response, progress: bool = False) -> Iterator[str]:
    """The data fields of a server-sent event stream (comments and keep-alives skipped;
    with `progress`, Shoal's prefill-progress comments are passed on as they are)."""
    data: list[str] = []
    for line in response.iter_lines():
        if progress and line.startswith(PROGRESS):
            yield line
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            yield "\n".join(data)
            data = []


def _delta_from_chunk(chunk: dict[str, Any]) -> ChatDelta:
    choices = chunk.get("choices") or []
    text, reasoning, finish = "", "", None
    if choices:
        delta = choices[0].get("delta") or {}
        text = delta.get("content") or ""
        reasoning = delta.get("reasoning_content") or ""
        finish = choices[0].get("finish_reason")
    return ChatDelta(text=text, reasoning=reasoning, finish_reason=finish,
                     usage=chunk.get("usage"),
                     shoal=chunk.get("shoal") or {})


def _malformed(route: str, what: str) -> ShoalError:
    return ShoalError(f"The node's answer to {route} is not what this app expects ({what}): "
                      "it may run another version of Shoal")


def _sane(r: ReplicaInfo) -> bool:
    numbers = (r.running, r.waiting, r.streams, r.routed, r.share)
    return (isinstance(r.model, str) and isinstance(r.node, str)
            and isinstance(r.strategy, str) and isinstance(r.name, str | None)
            and isinstance(r.nodes, list) and all(isinstance(n, str) for n in r.nodes)
            and all(isinstance(x, int | float) and x >= 0 for x in numbers))


def _record(cls: Any, data: Any, route: str) -> Any:
    """cls.from_json(data), or a ShoalError where the answer isn't such a record (a broken
    or foreign server) rather than a TypeError deep in a view."""
    try:
        if not isinstance(data, dict):
            raise TypeError(f"not a JSON object: {data!r:.100}")
        return cls.from_json(data)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise _malformed(route, str(e)) from e


def _error_from(status: int, body: bytes) -> ShoalError:
    try:
        return ShoalError.from_openai(json.loads(body), status)
    except (ValueError, AttributeError):
        e = ShoalError(f"The node answered HTTP {status}: {body[:200]!r}")
        e.status = status
        return e
