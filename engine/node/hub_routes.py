"""HTTP routes for models from the Hugging Face Hub: the catalog and search, background
downloads (progress, cancel), removing a model, and the two peer routes that let a
neighbour copy files from this node's Hugging Face cache instead of the internet.

`setup_hub(app)` adds the routes (the peer ones only when the app has a cluster, whose
verifier signs them) and the download registry; it is idempotent."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from aiohttp import web

from engine.errors import BadRequest, Busy, Cancelled, ModelNotFound, ShoalError
from engine.node.incoming import json_object
from engine.records import (
    CatalogInfo,
    CatalogModel,
    DownloadInfo,
    DownloadProgress,
    DownloadState,
    ErrorInfo,
    FilesAt,
)

if TYPE_CHECKING:
    from engine.hub.neighbour import CachedRevision

log = logging.getLogger(__name__)
routes = web.RouteTableDef()  # for the GUI and the CLI
peer_routes = web.RouteTableDef()  # for other nodes: only with a cluster (signed requests)
KEEP_FINISHED = 50
_REGISTRIES: dict[int, Downloads] = {}  # when setup_hub was not called


@dataclass
class Download:
    id: str
    repo: str
    revision: str
    layers: tuple[int, int] | None
    state: DownloadState = DownloadState.RUNNING
    progress: DownloadProgress | None = None
    error: ShoalError | None = None  # why it failed or stopped
    path: str | None = None
    started: float = field(default_factory=time.time)
    cancel: threading.Event = field(default_factory=threading.Event)

    def info(self) -> DownloadInfo:
        return DownloadInfo(self.id, self.repo, self.revision,
                            list(self.layers) if self.layers else None, self.state,
                            self.progress,
                            ErrorInfo(**self.error.to_openai()["error"])
                            if self.error else None,
                            self.path, self.started)


class Downloads:
    """This node's downloads. Each runs in a daemon thread, so a node that stops never
    waits for one: its finished bytes stay in the cache and the next pull resumes."""

    def __init__(self) -> None:
        self.all: dict[str, Download] = {}

    def start(self, request: web.Request, repo: str, revision: str,
              layers: tuple[int, int] | None) -> tuple[Download, bool]:
        for d in self.all.values():
            if d.state == DownloadState.RUNNING and \
                    (d.repo, d.revision, d.layers) == (repo, revision, layers):
                return d, False
        d = Download(uuid.uuid4().hex[:12], repo, revision, layers)
        finished = [k for k, v in self.all.items() if v.state != DownloadState.RUNNING]
        for k in finished[:max(0, len(finished) - KEEP_FINISHED)]:
            del self.all[k]
        self.all[d.id] = d
        node, cluster = request.app["node"], request.app.get("cluster")
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._run, args=(d, node, cluster, loop), daemon=True,
                         name=f"pull-{repo}").start()
        return d, True

    def _run(self, d: Download, node: Any, cluster: Any,
             loop: asyncio.AbstractEventLoop) -> None:
        from engine.hub.download import pull
        from engine.hub.neighbour import NeighbourSource
        from engine.hub.token import TokenStore
        try:
            sources = [NeighbourSource(cluster.peers, loop)] if cluster is not None else []
            path = pull(d.repo, d.revision, token=TokenStore(node.home).get(),
                        progress_cb=lambda p: setattr(d, "progress", p),
                        cancel_event=d.cancel, layers=d.layers, sources=sources)
            d.path, d.state = str(path), DownloadState.DONE
        except Cancelled as e:  # (kept without its traceback, which holds the pull's frames)
            d.state, d.error = DownloadState.CANCELLED, e.with_traceback(None)
        except ShoalError as e:
            d.state, d.error = DownloadState.FAILED, e.with_traceback(None)
        except Exception as e:  # a bug must still end the download visibly
            log.exception("download of %s failed", d.repo)
            d.state, d.error = DownloadState.FAILED, ShoalError(f"Internal error: {e}")
        log.info("download %s of %s: %s", d.id, d.repo, d.state)

    def stop_all(self) -> None:
        for d in self.all.values():
            d.cancel.set()


def setup_hub(app: web.Application) -> web.Application:
    """Add the hub routes and the download registry to a node's app (before it starts)."""
    if "hub_downloads" not in app:
        app["hub_downloads"] = Downloads()
        app.add_routes(routes)
        if app.get("cluster") is not None:  # the auth middleware then checks signatures
            app.add_routes(peer_routes)

        async def stop(app: web.Application) -> None:
            app["hub_downloads"].stop_all()
        app.on_shutdown.append(stop)
    return app


def _downloads(request: web.Request) -> Downloads:
    found = request.app.get("hub_downloads")
    return found if found is not None else _REGISTRIES.setdefault(id(request.app),
                                                                   Downloads())


# --- peer routes (signed with the cluster secret by the auth middleware) ----------------
@peer_routes.get("/shoal/peer/files-index")
async def files_index(request: web.Request) -> web.Response:
    from engine.hub.local import default_hf_cache
    from engine.hub.names import repo_id_problem
    from engine.hub.neighbour import cache_index
    repo = request.query.get("repo") or None
    why = repo_id_problem(repo) if repo is not None else None
    if why:
        raise BadRequest(f"repo must be a Hugging Face repo id (owner/name): {why}.",
                         param="repo")
    held = await asyncio.to_thread(cache_index, default_hf_cache(), repo)
    return web.json_response([r.to_json() for r in held])


@peer_routes.get("/shoal/peer/files/{owner}/{name}/{revision}/{path:.+}")
async def peer_file(request: web.Request) -> web.StreamResponse:
    from engine.hub.local import default_hf_cache
    from engine.hub.neighbour import cached_file
    m = request.match_info
    repo = f"{m['owner']}/{m['name']}"
    blob = await asyncio.to_thread(cached_file, default_hf_cache(), repo, m["revision"],
                                   m["path"])
    if blob is None:
        from engine.hub.names import shown
        raise ModelNotFound(f"This node has no {shown(m['path'])} of {shown(repo)} at "
                            f"{shown(m['revision'])}.")
    # FileResponse answers Range requests (206) itself, with sendfile
    return web.FileResponse(blob, headers={"X-Linked-Etag": blob.name,
                                           "Cache-Control": "no-store"})


# --- user routes ------------------------------------------------------------------------
@routes.get("/shoal/hub/catalog")
async def catalog(request: web.Request) -> web.Response:
    """{"models": [...], "hub_error": null}: the curated catalog and the models on disk
    here and on the other nodes."""
    from engine.hub.catalog import browse
    node = request.app["node"]
    found = await asyncio.to_thread(
        lambda: browse(node.models_dir, None, _cluster_memory(request)))
    return web.json_response((await _annotated(request, found)).to_json())


@routes.get("/shoal/hub/search")
async def search(request: web.Request) -> web.Response:
    """The catalog, models on disk (here and on peers) and the Hub's MLX models
    matching q."""
    from engine.hub.catalog import browse
    q = request.query.get("q", "").strip()
    node, token = request.app["node"], await _token(request)
    found = await asyncio.to_thread(
        lambda: browse(node.models_dir, q, _cluster_memory(request), True, token))
    return web.json_response((await _annotated(request, found)).to_json())


@dataclass(frozen=True)
class Fit:
    """The planner's answer for one model on the live cluster."""
    fits: bool
    reason: str | None = None  # the first rejection's, when it doesn't fit


async def _annotated(request: web.Request, found: CatalogInfo) -> CatalogInfo:
    """browse()'s answer with the planner's fit (fit_basis "planner", with fit_reason when
    it doesn't fit; "size" where the planner wasn't asked) and the peers' copies added to
    each model's `local`."""
    fit = await asyncio.to_thread(_planner_fit, request, found.models)
    held = await _peer_copies(request)
    models = []
    for m in found.models:
        if m.id in fit:
            m = replace(m, fits=fit[m.id].fits, fit_basis="planner",
                        fit_reason=fit[m.id].reason)
        models.append(replace(m, local=[*m.local, *held.get(m.id, [])]))
    return replace(found, models=models)


def _planner_fit(request: web.Request, models: list[CatalogModel]) -> dict[str, Fit]:
    """By model id, for models whose config is on disk here: whether the planner (weights,
    KV cache, activations and overhead on the live cluster) finds them a placement."""
    from engine.node.planning import cluster_view, plan_from_cluster
    cluster = request.app.get("cluster")
    if cluster is None:
        return {}
    view = cluster_view(cluster.plan_infos())  # once, not per model
    out: dict[str, Fit] = {}
    for m in models:
        if not m.local:
            continue
        try:
            report = plan_from_cluster(view["nodes"], context=None, links=view["links"],
                                       model_name=m.id, **cluster.model_facts(m.id))
        except Exception as e:  # an odd config must not break the list
            log.info("no plan for %s: %s", m.id, e)
            continue
        reason = report.rejections[0].reason if report.rejections else None
        out[m.id] = Fit(bool(report.placements), None if report.placements else reason)
    return out


async def _peer_copies(request: web.Request) -> dict[str, list[FilesAt]]:
    """By repo, the trusted peers whose Hugging Face cache holds it."""
    from engine.hub.neighbour import read_index
    cluster = request.app.get("cluster")
    peers = [p for p in cluster.peers.all() if p.trusted] if cluster is not None else []

    async def index(p: Any) -> list[CachedRevision]:
        try:
            return read_index(await cluster.peers.call(p.url, "GET",
                                                       "/shoal/peer/files-index", timeout=3))
        except ShoalError:
            return []
    held: dict[str, list[FilesAt]] = {}
    for p, entries in zip(peers, await asyncio.gather(*(index(p) for p in peers))):
        for e in entries:
            held.setdefault(e.repo, []).append(
                FilesAt("peer", node=p.name or p.url, files=len(e.files)))
    return held


@routes.post("/shoal/hub/pull")
async def start_pull(request: web.Request) -> web.Response:
    usage = ('Send {"repo": "owner/name", "revision": "main", "layers": [start, end]} '
             '(revision and layers optional).')
    body = await json_object(request, usage, "repo")
    if not isinstance(body.get("repo"), str):
        raise BadRequest(usage, param="repo")
    revision = body.get("revision") or "main"
    layers = body.get("layers")
    if layers is not None:
        if not (isinstance(layers, list) and len(layers) == 2 and
                all(isinstance(v, int) for v in layers) and 0 <= layers[0] < layers[1]):
            raise BadRequest("layers must be [start, end) with 0 <= start < end.",
                             param="layers")
        layers = (layers[0], layers[1])
    if not isinstance(revision, str):
        raise BadRequest("revision must be a string", param="revision")
    from engine.hub.names import bad_repo_id, repo_id_problem, revision_problem, shown
    repo = body["repo"].strip()
    why = repo_id_problem(repo)
    if why:  # checked here too, so the answer is a 400 and not a failed download
        raise bad_repo_id(repo, why)
    why = revision_problem(revision)
    if why:
        raise BadRequest(f"The revision {shown(revision)} is not a branch, tag or commit "
                         f"name: {why}.", param="revision")
    d, new = _downloads(request).start(request, repo, revision, layers)
    return web.json_response(d.info().to_json(), status=202 if new else 200)


@routes.get("/shoal/hub/downloads")
async def list_downloads(request: web.Request) -> web.Response:
    return web.json_response([d.info().to_json() for d in _downloads(request).all.values()])


@routes.delete("/shoal/hub/downloads/{id}")
async def cancel_download(request: web.Request) -> web.Response:
    d = _downloads(request).all.get(request.match_info["id"])
    if d is None:
        raise BadRequest(f"There is no download {request.match_info['id']} on this node.")
    d.cancel.set()
    return web.json_response(d.info().to_json())


@routes.put("/shoal/models/{id:.+}/settings")
async def model_settings(request: web.Request) -> web.Response:
    """{"context_limit": N | null}: serve the model with less context than it declares
    (less KV memory). The listings and the planner use it at once; a loaded model gets it
    when it next loads."""
    model_id = _model_id(request)
    node = request.app["node"]
    body = await json_object(request, "Send {\"context_limit\": TOKENS or null}.",
                             "context_limit")
    unknown = sorted(set(body) - {"context_limit"})
    if unknown:
        raise BadRequest(f"Unknown setting {unknown[0]!r}: a model has context_limit.",
                         param=unknown[0])
    model = next((m for m in node.local_models() if m.id == model_id), None)
    if model is None:
        raise ModelNotFound(f"No model {model_id!r} on this node.", param="id")
    from engine.hub.checkpoint import model_context, read_config
    declared = model_context(await asyncio.to_thread(read_config, model.path))
    node.model_settings.set_context_limit(model_id, body.get("context_limit"), declared)
    loaded = getattr(node.runner, "model", None) == model_id
    return web.json_response({
        "model": model_id, "context_limit": node.model_settings.context_limit(model_id),
        "context_length": node.model_settings.capped(model_id, declared),
        "declared_context": declared, "applies": "next load" if loaded else "now"})


@routes.delete("/shoal/models/{id:.+}")
async def remove_model(request: web.Request) -> web.Response:
    model_id = _model_id(request)
    node = request.app["node"]
    if getattr(node.runner, "model", None) == model_id:
        raise Busy(f"{model_id} is loaded on this node: unload it first.")
    if any(d.state == DownloadState.RUNNING and d.repo == model_id
           for d in _downloads(request).all.values()):
        raise Busy(f"{model_id} is downloading: cancel the download first.")
    from engine.hub.catalog import remove_model as remove
    freed = await asyncio.to_thread(remove, node.models_dir, model_id)
    return web.json_response({"deleted": model_id, "freed_bytes": freed})


def _model_id(request: web.Request) -> str:
    """The {id} of a /shoal/models/{id} route; BadRequest for one no model can have."""
    from engine.hub.names import model_id_problem, shown
    model_id = request.match_info["id"]
    why = model_id_problem(model_id)
    if why:
        raise BadRequest(f"'model' is not a model name ({shown(model_id, 40)}): {why}.",
                         param="model")
    return model_id


async def _token(request: web.Request) -> str | None:
    from engine.hub.token import TokenStore
    return await asyncio.to_thread(TokenStore(request.app["node"].home).get)


def _cluster_memory(request: web.Request) -> int | None:
    """Memory the cluster's GPUs may use: this node's plus what trusted peers report."""
    from engine.telemetry.memory import memory_info
    total = memory_info().available_bytes
    cluster = request.app.get("cluster")
    for p in cluster.peers.all() if cluster is not None else []:
        machine = p.info.machine if p.trusted and p.info else None
        if machine is not None and isinstance(machine.memory.available_bytes, int):
            total = (total or 0) + machine.memory.available_bytes
    return total
