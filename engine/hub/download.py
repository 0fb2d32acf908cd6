"""Downloads from the Hugging Face Hub into the user's Hugging Face cache, laid out as
huggingface_hub lays it out (blobs/<etag>, snapshots/<commit>/<path> symlinks, refs/), so
mlx-lm, `hf download` and Shoal share one copy.

huggingface_hub 2.x names each partial file per process and deletes it when a download
fails, so a crash or a pulled cable restarts the file from zero. Shoal keeps one partial
file per blob (blobs/<etag>.incomplete, huggingface_hub's older name) under the lock
huggingface_hub itself takes, and resumes it with a Range request. Metadata, headers,
redirects and errors are huggingface_hub's own. Every file is checked against the Hub's
size and hash (the blob's name) before it appears in a snapshot.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from engine.errors import BadRequest, Cancelled, CorruptModel, ShoalError
from engine.hub.errors import (
    GatedModel,
    HubOffline,
    HubUnreachable,
    InsufficientDisk,
    hub_error,
    not_mlx,
)
from engine.hub.hfcache import (  # noqa: F401 (re-exported)
    Plan,
    RemoteFile,
    _adopt_partials,
    blob_path,
    link_snapshot,
    read_ref,
    repo_dir,
    verify_file,
    verify_snapshot,
    write_ref,
)
from engine.hub.local import default_hf_cache
from engine.hub.names import (
    bad_repo_id,
    check_plan,
    etag_problem,
    path_problem,
    repo_id_problem,
    revision_problem,
    shown,
)
from engine.hub.progress import Tracker
from engine.hub.shards import SIDE_PATTERNS, files_for_layers
from engine.records import DownloadProgress

log = logging.getLogger(__name__)
DEFAULT_PATTERNS = ("model*.safetensors", *SIDE_PATTERNS)
INDEX = "model.safetensors.index.json"
RETRIES = 5  # attempts in a row that bring no new byte, before giving up
BACKOFF_S = 0.25  # first wait after a drop; doubles up to 8 s


class Source(Protocol):
    """Somewhere other than the Hub that may have the files (a neighbour node)."""
    name: str

    def plan(self, repo_id: str, revision: str) -> Plan | None:
        """Its file list for repo_id@revision, checked with engine.hub.names.check_plan
        (UnsafeName naming the source), or None when it has none."""

    def fetch(self, repo_id: str, commit: str, f: RemoteFile, dest: Path,
              on_progress: Callable[[int], None], cancel: threading.Event) -> str | None:
        """Append f's bytes to dest from its current size; where they came from, or None
        when this source doesn't have the file."""


def pull(repo_id: str, revision: str | None = None, cache_dir: Path | None = None,
         allow_patterns: Sequence[str] | None = None, token: str | None = None,
         progress_cb: Callable[[DownloadProgress], None] | None = None,
         cancel_event: threading.Event | None = None, *,
         layers: tuple[int, int] | None = None, sources: Sequence[Source] = (),
         endpoint: str | None = None) -> Path:
    """Bring `repo_id` at `revision` into the Hugging Face cache; returns the snapshot
    folder. Only files matching allow_patterns (default: what mlx-lm loads); with
    `layers=(start, end)`, only the weight files holding those layers. Sources (neighbour
    nodes) are tried before the Hub. A token of None means huggingface_hub's own (HF_TOKEN
    or `hf auth login`). Raises ShoalErrors that say what to do; Cancelled keeps the
    finished bytes for the next pull. Every name the Hub or a neighbour sends is checked
    before anything is written (UnsafeName names the source and the name)."""
    why = repo_id_problem(repo_id)
    if why:
        raise bad_repo_id(repo_id, why)
    revision = revision or "main"
    why = revision_problem(revision)
    if why:
        raise BadRequest(f"The revision {shown(revision)} is not a branch, tag or commit "
                         f"name ({why}). Leave it empty for the latest one.",
                         param="revision")
    cache = Path(cache_dir) if cache_dir else default_hf_cache()
    hub = Hub(repo_id, endpoint, token)
    plan = _make_plan(hub, sources, repo_id, revision, cache, allow_patterns is None)
    patterns = tuple(allow_patterns or DEFAULT_PATTERNS)
    files = [f for f in plan.files if any(fnmatch.fnmatch(f.path, p) for p in patterns)]
    job = _Job(plan, cache, [*sources, hub], Tracker(repo_id, revision, progress_cb),
               cancel_event or threading.Event())
    if layers is not None:
        files = job.only_layers(files, layers)
    job.run(files)
    missing = missing_weights(job.snapshot) if layers is None and not allow_patterns else []
    if missing:  # a file list from the cache or a neighbour that had only part of it
        raise HubUnreachable(f"Only part of {repo_id} could be found without the Hub "
                             f"(missing {', '.join(missing[:3])}). Connect to the internet, "
                             "or to a node that has all of it, and pull again.")
    return job.snapshot


def missing_weights(snapshot: Path) -> list[str]:
    """The files mlx-lm would need that the snapshot lacks (config and weights)."""
    if not (snapshot / "config.json").is_file():
        return ["config.json"]
    index = snapshot / INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        bad = next((n for n in names if path_problem(n)), None)
        if bad is not None:  # the index came from the Hub or a neighbour
            raise CorruptModel(f"{INDEX} of this model names the weights file {shown(bad)}: "
                               f"{path_problem(bad)}. Pull it again from the Hub.")
        return [n for n in names if not (snapshot / n).is_file()]
    return [] if any(snapshot.glob("model*.safetensors")) else ["model.safetensors"]


def _make_plan(hub: Hub, sources: Sequence[Source], repo_id: str, revision: str,
               cache: Path, check_runnable: bool) -> Plan:
    """The Hub's file list; when the Hub can't be reached, a neighbour's, else the cache's."""
    error: ShoalError
    try:
        return hub.plan(revision, check_runnable)
    except (HubUnreachable, HubOffline) as e:
        error = e
    for s in sources:
        p = s.plan(repo_id, revision)
        if p is not None:
            log.info("the Hub is unreachable (%s); using %s's file list", error.message,
                     s.name)
            return p
    p = plan_from_cache(cache, repo_id, revision)
    if p is not None:
        return p
    raise error


def plan_from_cache(cache: Path, repo_id: str, revision: str) -> Plan | None:
    """What the cache already holds for repo_id@revision, as a Plan (blob names are
    etags, so it can still be verified offline). Files the Hub could not have named
    (by the rule of engine.hub.names) are left out."""
    repo = repo_dir(cache, repo_id)
    commit = read_ref(repo, revision)
    if commit is None or not (repo / "snapshots" / commit).is_dir():
        return None
    snap = repo / "snapshots" / commit
    blobs = (repo / "blobs").resolve()
    files = []
    for p in sorted(snap.rglob("*")):
        blob = p.resolve()
        if p.is_symlink() and blob.is_file():
            rel = p.relative_to(snap).as_posix()
            if path_problem(rel) or etag_problem(blob.name) or blob.parent != blobs:
                log.info("%s of %s in the cache is not a file the Hub could have named; "
                         "left out", shown(rel), repo_id)
                continue
            files.append(RemoteFile(rel, blob.stat().st_size, blob.name))
    return check_plan(Plan(repo_id, revision, commit, tuple(files)),
                      "the Hugging Face cache")


class Hub:
    """The Hugging Face Hub at HF_ENDPOINT (read at call time), through huggingface_hub."""
    name = "hub"

    def __init__(self, repo_id: str, endpoint: str | None, token: str | None):
        from huggingface_hub import constants, get_token
        self.repo_id = repo_id
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT")
                         or constants._HF_DEFAULT_ENDPOINT).rstrip("/")
        self.token = token
        self.token_given = bool(token or get_token())
        self.offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES",
                                                                         "TRUE")

    def _error(self, e: BaseException, revision: str = "main") -> ShoalError:
        return hub_error(e, self.repo_id, revision, self.endpoint, self.token_given)

    @staticmethod
    def _offline(what: str) -> HubOffline:
        return HubOffline(f"Shoal is set to work offline (HF_HUB_OFFLINE), and {what} isn't "
                          "downloaded yet (or only in part). Unset HF_HUB_OFFLINE to "
                          "download it, or choose a model already downloaded.")

    def plan(self, revision: str, check_runnable: bool = True) -> Plan:
        if self.offline:
            raise self._offline(self.repo_id)
        from huggingface_hub import HfApi
        try:
            info = HfApi(endpoint=self.endpoint).model_info(
                self.repo_id, revision=revision, files_metadata=True, token=self.token)
        except Exception as e:
            raise self._error(e, revision) from None
        if info.gated and not self.token_given:
            raise GatedModel(f"{self.repo_id} is gated: accept its conditions at "
                             f"https://huggingface.co/{self.repo_id}, then enter a Hugging "
                             "Face token with `shoal models login` (or in the app's "
                             "settings).")
        if not info.sha:
            raise ShoalError(f"The Hub did not say which commit of {self.repo_id} it "
                             f"serves at {revision}; try again later.")
        files = []
        for s in info.siblings or []:
            etag = s.lfs.sha256 if s.lfs else s.blob_id
            size = s.lfs.size if s.lfs else s.size
            if etag is None or size is None:
                raise ShoalError(f"The Hub did not send the size and hash of "
                                 f"{shown(s.rfilename)} in {self.repo_id}, so it can't be "
                                 "verified.")
            files.append(RemoteFile(s.rfilename, size, etag))
        plan = check_plan(Plan(self.repo_id, revision, str(info.sha), tuple(files)),
                          f"the Hub ({self.endpoint})",
                          "No real repository has such a name: check HF_ENDPOINT, or try "
                          "again later.")
        if check_runnable:
            _check_runnable(self.repo_id, [f.path for f in plan.files],
                            (info.config or {}).get("model_type"))
        return plan

    def fetch(self, repo_id: str, commit: str, f: RemoteFile, dest: Path,
              on_progress: Callable[[int], None], cancel: threading.Event) -> str:
        """Download f into dest, resuming from its size, retrying drops with backoff."""
        if self.offline:
            raise self._offline(f"{f.path} of {repo_id}")
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff
        url = hf_hub_url(repo_id, f.path, revision=commit, endpoint=self.endpoint)
        stalls = 0
        while True:
            have = dest.stat().st_size if dest.exists() else 0
            if have > f.size:
                dest.unlink()
                have = 0
            if have == f.size:
                return self.name
            got = 0
            try:
                meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint)
                headers = build_hf_headers(token=self.token)
                if _origin(meta.location) != _origin(url):  # a CDN: the token stays here
                    headers.pop("authorization", None)
                headers["Accept-Encoding"] = "identity"
                if have:
                    headers["Range"] = f"bytes={have}-"
                with http_stream_backoff("GET", meta.location, headers=headers,
                                         timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                                         retry_on_exceptions=(),
                                         retry_on_status_codes=(408, 429)) as r:
                    hf_raise_for_status(r)
                    if have and r.status_code != 206:  # Range ignored: start over
                        have = 0
                    with open(dest, "ab" if have else "wb") as out:
                        for chunk in r.iter_bytes():
                            if cancel.is_set():
                                raise Cancelled(f"The download of {repo_id} was cancelled.")
                            out.write(chunk)
                            got += len(chunk)
                            on_progress(have + got)
                if have + got >= f.size:
                    continue  # the size check at the top decides
                raise ConnectionError(f"the body of {f.path} ended after {have + got} of "
                                      f"{f.size} bytes")
            except Cancelled:
                raise
            except Exception as e:
                if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                    raise _disk_full(dest) from None
                err = self._error(e)
                stalls = 0 if got else stalls + 1
                if not isinstance(err, HubUnreachable) or stalls > RETRIES:
                    raise err from None
                log.warning("%s: %s; resuming at %d bytes", f.path, e, have + got)
                if cancel.wait(min(BACKOFF_S * 2 ** stalls, 8.0)):
                    raise Cancelled(f"The download of {repo_id} was cancelled.") from None


class _Job:
    """One pull: which files, in which order, from where, verified, then committed."""

    def __init__(self, plan: Plan, cache: Path, sources: list[Any], tracker: Tracker,
                 cancel: threading.Event):
        self.plan, self.cache, self.sources = plan, cache, sources
        self.tracker, self.cancel = tracker, cancel
        self.repo = repo_dir(cache, plan.repo_id)
        self.snapshot = self.repo / "snapshots" / plan.commit

    def only_layers(self, files: list[RemoteFile], layers: tuple[int, int]
                    ) -> list[RemoteFile]:
        """Fetch config + index first, then keep only the weight files with these layers."""
        side = [f for f in files if f.path in ("config.json", INDEX)]
        self.run(side, final=False)
        if not (self.snapshot / INDEX).is_file():
            return files  # one weights file: every rank needs it
        config = json.loads((self.snapshot / "config.json").read_text())
        total = config.get("num_hidden_layers") or \
            (config.get("text_config") or {}).get("num_hidden_layers")
        index = json.loads((self.snapshot / INDEX).read_text())
        try:
            if not isinstance(total, int):
                raise ValueError("config.json has no num_hidden_layers")
            wanted = files_for_layers(index.get("weight_map"), layers, total,
                                      layers[0] == 0)
        except (TypeError, ValueError, AttributeError) as e:
            raise BadRequest(f"Can't pick the files for layers {list(layers)} of "
                             f"{self.plan.repo_id}: {e}.", param="layers") from None
        return [f for f in files if not f.path.endswith(".safetensors") or f.path in wanted]

    def run(self, files: list[RemoteFile], final: bool = True) -> None:
        # weights first, config.json last: a snapshot with a config is a finished one
        order = sorted(files, key=lambda f: (f.path == "config.json", f.path == INDEX,
                                             not f.path.endswith(".safetensors"), f.path))
        self.tracker.add_files(order)
        self._check_disk(order)
        for f in order:
            self._ensure(f)
        if final and self.plan.revision != self.plan.commit:
            write_ref(self.repo, self.plan.revision, self.plan.commit)
        self.tracker.emit(force=True)

    def _check_disk(self, files: list[RemoteFile]) -> None:
        need = 0
        for f in files:
            blob = blob_path(self.repo, f.etag)
            if not (blob.is_file() and blob.stat().st_size == f.size):
                part = blob.with_name(f.etag + ".incomplete")
                need += f.size - (part.stat().st_size if part.is_file() else 0)
        where = self.repo
        while not where.exists():
            where = where.parent
        free = shutil.disk_usage(where).free
        if need > free:
            raise InsufficientDisk(
                f"{self.plan.repo_id} needs {_gb(need)} more on the disk holding {where}, "
                f"which has {_gb(free)} free. Free some space, or point HF_HUB_CACHE at a "
                "bigger disk, then pull again.")

    def _ensure(self, f: RemoteFile) -> None:
        from huggingface_hub.utils import WeakFileLock
        if self.cancel.is_set():
            raise Cancelled(f"The download of {self.plan.repo_id} was cancelled.")
        (self.repo / "blobs").mkdir(parents=True, exist_ok=True)
        blob = blob_path(self.repo, f.etag)
        lock = self.cache / ".locks" / self.repo.name / f"{blob.name}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(lock):  # the lock hf_hub_download takes for this blob
            if self._cached(f, blob):
                link_snapshot(self.repo, self.plan.commit, f.path, blob)
                self.tracker.update(f.path, f.size, "done", "cache")
                return
            part = blob.with_name(f.etag + ".incomplete")
            _adopt_partials(blob, part)
            sources = self.sources
            for _ in range(2):
                source = self._fetch(f, part, sources)
                self.tracker.update(f.path, f.size, "verifying")
                if verify_file(part, f):
                    os.replace(part, blob)
                    link_snapshot(self.repo, self.plan.commit, f.path, blob)
                    self.tracker.update(f.path, f.size, "done", source)
                    return
                log.warning("%s of %s from %s failed its hash check; fetching it again "
                            "from the Hub", f.path, self.plan.repo_id, source)
                part.unlink(missing_ok=True)
                sources = self.sources[-1:]
            raise CorruptModel(f"{f.path} of {self.plan.repo_id} arrived damaged twice (its "
                               "hash doesn't match the Hub's). Try again later.")

    def _cached(self, f: RemoteFile, blob: Path) -> bool:
        if not blob.is_file():
            return False
        self.tracker.update(f.path, f.size, "verifying", "cache")
        if verify_file(blob, f):
            return True
        log.warning("%s of %s in the cache is damaged (%s): fetching it again", f.path,
                    self.plan.repo_id, blob)
        blob.unlink()
        return False

    def _fetch(self, f: RemoteFile, part: Path, sources: list[Any]) -> str:
        for s in sources:
            have = part.stat().st_size if part.exists() else 0
            self.tracker.start(f.path, have, s.name)
            try:
                got = s.fetch(self.plan.repo_id, self.plan.commit, f, part,
                              lambda n: self.tracker.update(f.path, n), self.cancel)
            except (Cancelled, InsufficientDisk):
                raise
            except ShoalError as e:
                if s is self.sources[-1]:
                    raise
                log.warning("%s from %s failed (%s); trying the next source", f.path,
                            s.name, e.message)
                continue
            if got is not None:
                return got
        raise HubUnreachable(f"No source has {f.path} of {self.plan.repo_id}.")


def _check_runnable(repo_id: str, names: list[str], model_type: str | None) -> None:
    if "config.json" not in names or not any(fnmatch.fnmatch(n, "model*.safetensors")
                                             for n in names):
        raise not_mlx(repo_id, names)
    if model_type and _mlx_lm_knows(model_type) is False:
        from engine.errors import UnsupportedModel
        raise UnsupportedModel(f"{repo_id} is a '{model_type}' model, which the installed "
                               "mlx-lm can't run. Update Shoal, or pick another model.",
                               param="repo")


def _mlx_lm_knows(model_type: str) -> bool | None:
    """Whether mlx-lm has a model file for this type, found without importing mlx-lm
    (seconds): its package folder, and the family rule's own model_type → module table
    (engine.placement.families, checked against mlx-lm's MODEL_REMAPPING in the suite)."""
    import importlib.util

    from engine.placement.families import resolve
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None  # no mlx-lm here: the loader decides later
    pkg = Path(list(spec.submodule_search_locations)[0])
    return (pkg / "models" / f"{resolve(model_type)}.py").is_file()


def _origin(url: str) -> tuple[str, str]:
    u = urlsplit(url)
    return u.scheme, u.netloc.lower()


def _disk_full(where: Path) -> InsufficientDisk:
    return InsufficientDisk(f"The disk holding {where.parent} is full. Free some space, or "
                            "point HF_HUB_CACHE at a bigger disk, then pull again: the "
                            "finished part is kept.")


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
