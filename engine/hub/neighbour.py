"""Model files from a neighbour node instead of the internet.

Serving side: what this node's Hugging Face cache holds (an index of repo, commit, files,
sizes and hashes) and the safe way from a request to a blob. Fetching side: a download
Source (see engine.hub.download) that copies a file from the peer with the fastest link,
signed with the cluster secret; the download job then checks its hash and commits it into
the cache exactly where huggingface_hub would, falling back to the Hub.

A peer's names are input from another machine: the fetching side refuses a plan with any
name engine.hub.names refuses, and the serving side lists and serves only names that pass
the same rule.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from engine.errors import Cancelled, PeerUnreachable, ShoalError
from engine.hub import names
from engine.hub.errors import UnsafeName
from engine.hub.hfcache import Plan, RemoteFile, pointer_path, read_ref, repo_dir
from engine.records import Record

log = logging.getLogger(__name__)
CHUNK = 1 << 20


@dataclass(frozen=True)
class CachedFile(Record):
    """One complete file of a snapshot (GET /shoal/peer/files-index)."""
    path: str
    size: int
    etag: str  # the blob's name
    sha256: str | None = None  # the etag, where it is one (LFS files)


@dataclass(frozen=True)
class CachedRevision(Record):
    """A commit of a repo in a node's Hugging Face cache, the refs naming it, its files."""
    nested = {"files": CachedFile}
    repo: str
    revision: str
    refs: list[str] = field(default_factory=list)  # an older node's index has none
    files: list[CachedFile] = field(default_factory=list)


def cache_index(cache: Path, repo_id: str | None = None) -> list[CachedRevision]:
    """Every complete file in the cache, per repo and commit. Blob names are the Hub's
    etags, so this reads no file contents. Only names a pull would accept are listed
    (engine.hub.names): a repo, commit, ref, path or blob that breaks the rule is left
    out. BadRequest for a repo_id that is no Hugging Face repo id."""
    out: list[CachedRevision] = []
    repos = [repo_dir(cache, repo_id)] if repo_id else sorted(Path(cache).glob("models--*"))
    for repo in repos:
        snaps = repo / "snapshots"
        name = repo.name.removeprefix("models--").replace("--", "/", 1)
        if names.repo_id_problem(name) or not snaps.is_dir():
            continue
        refs: dict[str, list[str]] = {}
        for ref in (repo / "refs").rglob("*") if (repo / "refs").is_dir() else []:
            rel = ref.relative_to(repo / "refs").as_posix()
            commit = read_ref(repo, rel) if ref.is_file() else None
            if commit is not None and not names.COMMIT.fullmatch(rel):
                refs.setdefault(commit, []).append(rel)
        blobs = (repo / "blobs").resolve()
        for snap in sorted(p for p in snaps.iterdir() if p.is_dir()):
            if names.commit_problem(snap.name):
                continue
            files: list[CachedFile] = []
            for p in sorted(snap.rglob("*")):
                blob = p.resolve()
                rel = p.relative_to(snap).as_posix()
                if p.is_symlink() and blob.is_file() and blob.parent == blobs \
                        and not names.path_problem(rel) and not names.etag_problem(blob.name):
                    etag = blob.name
                    files.append(CachedFile(rel, blob.stat().st_size, etag,
                                            etag if len(etag) == 64 else None))
            out.append(CachedRevision(name, snap.name, refs.get(snap.name, []), files))
    return out


def read_index(got: Any) -> list[CachedRevision]:
    """A peer's answer to GET /shoal/peer/files-index; anything but a list is no index,
    and an entry that isn't one (a missing field, a size that isn't a count) is skipped."""
    out: list[CachedRevision] = []
    for e in got if isinstance(got, list) else []:
        try:
            rev = CachedRevision.from_json(e)
        except (TypeError, AttributeError):
            continue
        if isinstance(rev.repo, str) and isinstance(rev.revision, str) and all(
                isinstance(f, CachedFile) and isinstance(f.path, str) and
                isinstance(f.etag, str) and type(f.size) is int and f.size >= 0
                for f in rev.files):
            out.append(rev)
    return out


def cached_file(cache: Path, repo_id: str, revision: str, path: str) -> Path | None:
    """The blob behind snapshots/<revision>/<path>, or None. Refuses (None) any name a
    pull would refuse (engine.hub.names) and anything that would leave the repository's
    blobs folder (odd links)."""
    if names.repo_id_problem(repo_id) or names.revision_problem(revision) \
            or names.path_problem(path):
        return None
    repo = repo_dir(cache, repo_id)
    commit = read_ref(repo, revision)
    try:
        blob = pointer_path(repo, commit or "", path).resolve(strict=True)
    except (OSError, RuntimeError, UnsafeName):
        return None
    ok = blob.parent == (repo / "blobs").resolve() and not names.etag_problem(blob.name)
    return blob if ok and blob.is_file() else None


class NeighbourSource:
    """Files from the other nodes of the cluster, for engine.hub.download.pull.

    pull runs in a worker thread; the peers' aiohttp session lives on the node's event
    loop, so each request is run there and waited for here."""
    name = "neighbours"

    def __init__(self, peers: Any, loop: asyncio.AbstractEventLoop):
        self.peers = peers
        self.loop = loop
        # repo -> peer url -> what its cache holds of it
        self._index: dict[str, dict[str, list[CachedRevision]]] = {}

    # --- plumbing ----------------------------------------------------------------------
    def _run(self, coro: Any, cancel: threading.Event | None = None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while True:
            try:
                return fut.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                if cancel is not None and cancel.is_set():
                    fut.cancel()
                    raise Cancelled("The download was cancelled.") from None

    def _peers(self) -> list[Any]:
        """Trusted, reachable peers, the fastest link first."""
        ok = [p for p in self.peers.all() if p.trusted and p.reachable]
        return sorted(ok, key=lambda p: -(p.link.bandwidth_MBps or 0))

    def _entries(self, repo_id: str) -> dict[str, list[CachedRevision]]:
        if repo_id not in self._index:
            async def ask(url: str) -> list[CachedRevision]:
                try:
                    got = await self.peers.call(url, "GET",
                                                f"/shoal/peer/files-index?repo={repo_id}")
                    return read_index(got)
                except ShoalError as e:  # an older peer, or gone: just not a source
                    log.info("no file index from %s: %s", url, e.message)
                    return []

            async def ask_all() -> dict[str, list[CachedRevision]]:
                urls = [p.url for p in self._peers()]
                answers = await asyncio.gather(*(ask(u) for u in urls))
                return dict(zip(urls, answers))
            self._index[repo_id] = self._run(ask_all())
        return self._index[repo_id]

    # --- Source ------------------------------------------------------------------------
    def plan(self, repo_id: str, revision: str) -> Plan | None:
        """The file list of the peer with the most files of repo_id@revision. Checked as
        a whole (engine.hub.names.check_plan): UnsafeName naming the peer and the name
        for a path, commit or etag that could reach outside the cache."""
        best: CachedRevision | None = None
        best_url = ""
        for url, entries in self._entries(repo_id).items():
            for e in entries:
                if revision in (e.revision, *e.refs) and \
                        (best is None or len(e.files) > len(best.files)):
                    best, best_url = e, url
        if best is None:
            return None
        files = tuple(RemoteFile(f.path, f.size, f.etag) for f in best.files)
        return names.check_plan(
            Plan(repo_id, revision, best.revision, files), self._who(best_url),
            "If that machine is yours, check what runs on it; if not, change the cluster "
            "secret on your nodes to shut it out.")

    def _who(self, url: str) -> str:
        name = next((p.name for p in self.peers.all() if p.url == url and p.name), None)
        return f"peer {name} ({url})" if name else f"peer {url}"

    def fetch(self, repo_id: str, commit: str, f: RemoteFile, dest: Path,
              on_progress: Callable[[int], None], cancel: threading.Event) -> str | None:
        who = {p.url: p.name or p.url for p in self._peers()}
        for url, entries in self._entries(repo_id).items():
            has = any(e.revision == commit and any(
                x.path == f.path and names.normalize_etag(x.etag) == f.etag
                for x in e.files) for e in entries)
            if not has or url not in who:
                continue
            try:
                if self._run(self._stream(url, repo_id, commit, f, dest, on_progress,
                                          cancel), cancel):
                    return f"peer {who[url]}"
            except PeerUnreachable as e:
                log.warning("copying %s from %s failed: %s", f.path, url, e.message)
        return None

    async def _stream(self, url: str, repo_id: str, commit: str, f: RemoteFile, dest: Path,
                      on_progress: Callable[[int], None], cancel: threading.Event) -> bool:
        import aiohttp
        path = f"/shoal/peer/files/{repo_id}/{commit}/{quote(f.path)}"
        have = dest.stat().st_size if dest.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:  # the peer's answer is signed and comes over the cluster's TLS (Peers.stream)
            async with self.peers.stream(
                    url, "GET", path, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10,
                                                  sock_read=30)) as r:
                if r.status == 404:
                    return False
                if r.status not in (200, 206):
                    raise PeerUnreachable(f"{url} answered {r.status} for {f.path}")
                if r.status == 200:
                    have = 0
                done = have
                with open(dest, "ab" if have else "wb") as out:
                    async for chunk in r.content.iter_chunked(CHUNK):
                        if cancel.is_set():
                            raise Cancelled("The download was cancelled.")
                        out.write(chunk)
                        done += len(chunk)
                        on_progress(done)
                return done == f.size
        except (TimeoutError, aiohttp.ClientError) as e:
            raise PeerUnreachable(f"{url} stopped sending {f.path}: "
                                  f"{e or type(e).__name__}") from None
