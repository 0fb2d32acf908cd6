"""The model browser's list: the curated catalog shipped in resources/catalog.json, every
model already on disk (Shoal's folder and the Hugging Face cache), and Hub search results
when online. Each entry says where its files are and whether it fits the cluster."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from functools import cache
from pathlib import Path

from engine.records import CatalogInfo, CatalogModel, FilesAt

log = logging.getLogger(__name__)
CATALOG = Path(__file__).resolve().parent.parent.parent / "resources" / "catalog.json"
HEADROOM = 1.15  # weights plus KV cache and activations for a modest context
SEARCH_TIMEOUT_S = 10.0
# the Hub's pipeline_tag, as Shoal's capabilities (engine.protocol.CAPABILITIES)
_PIPELINE_CAPABILITIES = {
    "text-generation": ["generate"], "image-text-to-text": ["generate", "vision"],
    "feature-extraction": ["embed", "rerank"], "sentence-similarity": ["embed", "rerank"],
    "text-ranking": ["rerank"], "text-classification": ["rerank"]}


@cache
def load_catalog(path: Path = CATALOG) -> tuple[CatalogModel, ...]:
    """The curated entries; an unreadable file logs and gives an empty catalog."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return tuple(CatalogModel(
            id=m["id"], name=m.get("name") or m["id"].split("/")[-1],
            parameters=m.get("parameters"), quantization=m.get("quantization"),
            size_bytes=m.get("size_bytes"), layers=m.get("layers"),
            context_length=m.get("context_length"), licence=m.get("licence"),
            approximate=list(m.get("approximate") or ()),
            capabilities=_row_capabilities(m.get("capabilities"))) for m in doc["models"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("the model catalog %s is unreadable (%s)", path, e)
        return ()


def search_hub(query: str, limit: int = 30, token: str | None = None,
               endpoint: str | None = None) -> list[CatalogModel]:
    """MLX models on the Hub matching `query` (HF_ENDPOINT honoured); raises ShoalError.

    The request HfApi.list_models makes, made once: list_models retries a dead network
    for about 25 s, too long for a search box."""
    import os

    from huggingface_hub import ModelInfo, constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    from engine.hub.errors import hub_error
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT")
                or constants._HF_DEFAULT_ENDPOINT).rstrip("/")
    try:
        r = get_session().get(f"{endpoint}/api/models",
                              params={"search": query, "filter": "mlx", "limit": limit},
                              headers=build_hf_headers(token=token), timeout=SEARCH_TIMEOUT_S)
        hf_raise_for_status(r)
        found = [ModelInfo(**m) for m in r.json()]
    except Exception as e:
        raise hub_error(e, query, "main", endpoint, bool(token)) from None
    return [CatalogModel(id=m.id, name=m.id.split("/")[-1],
                         quantization=_quant_from_name(m.id), source="hub",
                         downloads=m.downloads, likes=m.likes,
                         capabilities=_PIPELINE_CAPABILITIES.get(m.pipeline_tag or ""))
            for m in found]


def browse(models_dir: Path, query: str | None = None, memory_bytes: int | None = None,
           online: bool = False, token: str | None = None,
           hf_cache: Path | None = None) -> CatalogInfo:
    """Catalog, local and (when online and asked) Hub entries merged by id, filtered by
    every word of `query`, each with whether it fits `memory_bytes`; `hub_error` says why
    the Hub couldn't be asked."""
    import os

    from engine.hub.local import list_local_models
    entries: dict[str, CatalogModel] = {e.id: e for e in load_catalog()}
    for m in list_local_models(Path(models_dir), hf_cache):
        where = FilesAt(source=m.source, path=str(m.path))
        known = entries.get(m.id)
        if known is not None:
            # the files' own config says what the model does, whatever the row says
            entries[m.id] = replace(known, local=[*known.local, where],
                                    capabilities=list(m.capabilities))
        else:
            entries[m.id] = CatalogModel(
                id=m.id, name=m.id.split("/")[-1], quantization=m.quantization,
                size_bytes=m.size_bytes, layers=m.layers,
                context_length=m.context_length, source="local", local=[where],
                capabilities=list(m.capabilities))
    hub_error = None
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if online and query and not offline:
        try:
            for e in search_hub(query, token=token):
                known = entries.get(e.id)
                entries[e.id] = e if known is None else replace(
                    known, downloads=e.downloads, likes=e.likes,
                    capabilities=known.capabilities or e.capabilities)
        except Exception as e:  # the catalog and local models still answer
            hub_error = getattr(e, "message", str(e))
    words = (query or "").lower().split()
    chosen = [e for e in entries.values() if all(w in e.id.lower() for w in words)]
    chosen.sort(key=lambda e: (not e.local, e.source == "hub", e.id.lower()))
    return CatalogInfo(models=[replace(e, fits=fits(e.size_bytes, memory_bytes))
                               for e in chosen], hub_error=hub_error)


def remove_model(models_dir: Path, model_id: str) -> int:
    """Delete a model from Shoal's folder or, with all its revisions, from the HF cache
    (a half-downloaded repository too). Returns the bytes freed."""
    import shutil

    from engine.errors import BadRequest, ModelNotFound
    from engine.hub.download import repo_dir
    from engine.hub.local import default_hf_cache, find_local_model
    from engine.hub.names import model_id_problem, repo_id_problem, shown
    why = model_id_problem(model_id)
    if why:
        raise BadRequest(f"'model' is not a model name ({shown(model_id, 40)}): {why}.",
                         param="model")
    found = find_local_model(Path(models_dir), model_id)
    target: Path | None = None
    if found is not None and found.source == "shoal":
        target = found.path
    elif not repo_id_problem(model_id):
        target = repo_dir(default_hf_cache(), model_id)
    if target is None or not target.is_dir():
        raise ModelNotFound(f"There is no model '{model_id}' on this machine. See "
                            "`shoal models list`.", param="model")
    size = sum(p.stat().st_size for p in target.rglob("*")
               if p.is_file() and not p.is_symlink())
    shutil.rmtree(target)
    return size


def fits(size_bytes: int | None, memory_bytes: int | None) -> bool | None:
    """Whether the weights (with headroom) fit the memory; None when either is unknown."""
    if not size_bytes or not memory_bytes:
        return None
    return size_bytes * HEADROOM <= memory_bytes


def _row_capabilities(value: object) -> list[str] | None:
    """A curated row's capabilities, the names Shoal knows; None (unknown) where the row
    doesn't say, so the app guesses from the name rather than showing a wrong badge."""
    from engine.protocol import CAPABILITIES
    if not isinstance(value, list):
        return None
    return [c for c in CAPABILITIES if c in value] or None


def _quant_from_name(repo_id: str) -> str | None:
    name = repo_id.lower()
    for q in ("mxfp4", "3bit", "4bit", "5bit", "6bit", "8bit", "bf16", "fp16"):
        if q in name:
            return q
    return None
