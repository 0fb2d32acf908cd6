"""A local stand-in for the Hugging Face Hub, good enough for the real `huggingface_hub`
client reached through HF_ENDPOINT: model info (with file metadata), resolve with ETag /
X-Linked-Etag / X-Repo-Commit and Range, the Hub's auth and gating errors, search, and an
optional CDN redirect for LFS files. Tests throttle it to a home-internet rate, drop
connections on purpose, and read its byte counters to prove what was (not) fetched again.
It can also turn hostile (`plant`, HubRepo.listed_sha): list and serve file paths, etags
and a commit no real repository has, as a compromised mirror at HF_ENDPOINT could.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".npz")
CHUNK = 64 * 1024


@dataclass
class HubFile:
    path: str
    source: Path
    size: int
    sha256: str
    git_sha1: str
    lfs: bool
    listed_etag: str | None = None  # what the listing and headers claim, when not the hash

    @property
    def etag(self) -> str:
        return self.listed_etag or (self.sha256 if self.lfs else self.git_sha1)


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    commit: str
    gated: str | bool = False  # False, "auto" or "manual", as the Hub reports it
    private: bool = False
    granted: set[str] | None = None  # users allowed into a gated repo (None: every user)
    owner: str | None = None
    listed_sha: str | None = None  # the commit the listing claims, when not the real one

    def revisions(self) -> tuple[str, ...]:
        return ("main", self.commit, *([self.listed_sha] if self.listed_sha else []))


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _describe_file(rel: str, source: Path) -> HubFile:
    data = source.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    lfs = rel.endswith(LFS_SUFFIXES)
    pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\n"
               f"size {len(data)}\n").encode()
    return HubFile(rel, source, len(data), sha, _git_sha1(pointer if lfs else data), lfs)


@dataclass
class Fault:
    path: str          # file path inside the repo ("" = every file)
    after: int         # bytes sent before the connection is cut
    times: int = 1


class HubServer:
    """Start with `with HubServer() as hub:`; `hub.url` goes into HF_ENDPOINT."""

    def __init__(self, rate_bps: float | None = None, cdn: bool = False):
        self.repos: dict[str, HubRepo] = {}
        self.tokens: dict[str, str] = {}   # token -> user name
        self.revoked: set[str] = set()
        self.rate_bps = rate_bps
        self.faults: list[Fault] = []
        self.down = False                  # answer nothing at all (a dead network)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._pace = 0.0
        self._servers: list[ThreadingHTTPServer] = []
        self._conns: set[socket.socket] = set()
        self._cdn = cdn
        self.url = ""
        self.cdn_url = ""

    # --- content ---------------------------------------------------------------------
    def add_repo(self, repo_id: str, folder: Path, *, gated: str | bool = False,
                 private: bool = False, owner: str | None = None,
                 granted: set[str] | None = None) -> HubRepo:
        files = {p.relative_to(folder).as_posix(): _describe_file(
                 p.relative_to(folder).as_posix(), p)
                 for p in sorted(folder.rglob("*")) if p.is_file()}
        commit = hashlib.sha1((repo_id + "".join(f.sha256 for f in files.values()))
                              .encode()).hexdigest()
        repo = HubRepo(repo_id, files, commit, gated, private, granted, owner)
        self.repos[repo_id] = repo
        return repo

    def plant(self, repo_id: str, path: str, source: Path, *,
              etag: str | None = None) -> HubFile:
        """List and serve `source` as `path` of repo_id, whatever the path (../x, /abs,
        a\\b): a hostile Hub. With `etag`, the listing and the headers claim that instead
        of the file's hash."""
        f = _describe_file(path, source)
        f.listed_etag = etag
        self.repos[repo_id].files[path] = f
        return f

    def add_token(self, token: str, user: str = "tester") -> None:
        self.tokens[token] = user
        self.revoked.discard(token)

    def revoke(self, token: str) -> None:
        self.revoked.add(token)

    def drop_after(self, path: str, nbytes: int, times: int = 1) -> None:
        """Cut the connection after `nbytes` of the next `times` GETs of `path`."""
        self.faults.append(Fault(path, nbytes, times))

    # --- counters ----------------------------------------------------------------------
    def served(self, repo_id: str | None = None, path: str | None = None) -> int:
        """Body bytes written to clients for GETs of a file (all files by default)."""
        with self._lock:
            return sum(r["sent"] for r in self.requests if r["method"] == "GET"
                       and r.get("file") and (repo_id is None or r["repo"] == repo_id)
                       and (path is None or r["file"] == path))

    def file_requests(self, path: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self.requests
                    if r.get("file") and (path is None or r["file"] == path)]

    def reset_counters(self) -> None:
        with self._lock:
            self.requests.clear()

    # --- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> HubServer:
        hosts = ["127.0.0.1"] + (["127.0.0.2"] if self._cdn else [])
        for host in hosts:
            srv = ThreadingHTTPServer((host, 0), _handler_for(self))
            srv.daemon_threads = True
            self._servers.append(srv)
            threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self._servers[0].server_port}"
        if self._cdn:  # another origin, like the Hub's LFS CDN: no auth header goes there
            self.cdn_url = f"http://127.0.0.2:{self._servers[1].server_port}"
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (kept-alive ones too)."""
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        self._servers.clear()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _throttle(self, n: int) -> None:
        """One shared pace for all connections, like one home line."""
        if not self.rate_bps:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._pace)
            self._pace = start + n / self.rate_bps
        delay = self._pace - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _take_fault(self, path: str) -> int | None:
        with self._lock:
            for f in self.faults:
                if f.times > 0 and f.path in ("", path):
                    f.times -= 1
                    return f.after
        return None


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass
    Handler.hub = hub
    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub._conns.add(self.connection)

    def finish(self) -> None:
        with self.hub._lock:
            self.hub._conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # --- plumbing ------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, data: Any, head: bool = False) -> None:
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"}, head)

    def _error(self, status: int, message: str, code: str | None = None,
               head: bool = False, extra: dict[str, str] | None = None) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message,
                   **({"X-Error-Code": code} if code else {}), **(extra or {})}
        self._send(status, json.dumps({"error": message}).encode(), headers, head)

    def _user(self, head: bool) -> tuple[bool, str | None]:
        """(ok, user). A token the Hub doesn't know is refused on every route, as there."""
        auth = self.headers.get("Authorization", "")
        if not auth.lower().startswith("bearer "):
            return True, None
        token = auth.split(None, 1)[1].strip()
        if token in self.hub.tokens and token not in self.hub.revoked:
            return True, self.hub.tokens[token]
        self._error(401, "Invalid credentials in Authorization header", head=head)
        return False, None

    def _repo(self, repo_id: str, user: str | None, head: bool) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and user != repo.owner):
            # the Hub answers 401 to anonymous callers, 404 to logged-in ones
            self._error(404 if user else 401, "Repository not found", "RepoNotFound", head)
            return None
        return repo

    def _route(self, head: bool) -> None:
        if self.hub.down:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if parts[:1] == ["cdn"] and len(parts) == 2:
            return self._cdn(parts[1], head)
        ok, user = self._user(head)
        if not ok:
            return
        if parts[:2] == ["api", "whoami-v2"]:
            if user is None:
                return self._error(401, "Invalid username or password.", head=head)
            return self._json({"type": "user", "name": user,
                               "auth": {"accessToken": {"displayName": "test",
                                                        "role": "read"}}}, head)
        if parts[:2] == ["api", "models"] and len(parts) == 2:
            return self._search(query, user, head)
        if parts[:2] == ["api", "models"] and len(parts) in (4, 6):
            repo = self._repo("/".join(parts[2:4]), user, head)
            if repo is not None:
                rev = parts[5] if len(parts) == 6 and parts[4] == "revision" else "main"
                if rev not in repo.revisions():
                    return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound",
                                       head)
                self._json(_info(repo, blobs=query.get("blobs", "").lower() == "true"), head)
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]),
                                 user, head)
        self._error(404, "Not found", head=head)

    def _search(self, query: dict[str, str], user: str | None, head: bool) -> None:
        needle = query.get("search", "").lower()
        tag = query.get("filter")
        limit = int(query.get("limit", "1000"))
        found = [_info(r, blobs=False) for r in self.hub.repos.values()
                 if (not r.private or user == r.owner) and needle in r.repo_id.lower()]
        found = [m for m in found if tag is None or tag in m["tags"]]
        self._json([{k: m[k] for k in ("_id", "id", "modelId", "author", "tags", "likes",
                                       "downloads", "library_name", "private", "gated",
                                       "createdAt", "pipeline_tag")}
                    for m in found[:limit]], head)

    def _resolve(self, repo_id: str, rev: str, path: str, user: str | None,
                 head: bool) -> None:
        repo = self._repo(repo_id, user, head)
        if repo is None:
            return
        if repo.gated and user is None:
            return self._error(401, f"Access to model {repo_id} is restricted. You must "
                               "have access to it and be authenticated to access it. "
                               "Please log in.", "GatedRepo", head)
        if repo.gated and repo.granted is not None and user not in repo.granted:
            return self._error(403, f"Access to model {repo_id} is restricted and you are not "
                               "in the authorized list. Visit https://huggingface.co/"
                               f"{repo_id} to ask for access.", "GatedRepo", head)
        if rev not in repo.revisions():
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound", head)
        f = repo.files.get(path)
        commit = {"X-Repo-Commit": repo.commit}
        if f is None:
            return self._error(404, "Entry not found", "EntryNotFound", head, commit)
        if f.lfs:
            linked = {**commit, "X-Linked-Etag": f'"{f.etag}"', "X-Linked-Size": str(f.size)}
            if self.hub.cdn_url:
                loc = f"{self.hub.cdn_url}/cdn/{f.sha256}?x-signed=1"
                return self._send(302, b"", {**linked, "Location": loc,
                                             "ETag": f'"{f.git_sha1}"'}, head)
            return self._file(repo, f, head, {**linked, "ETag": f'"{f.etag}"'})
        self._file(repo, f, head, {**commit, "ETag": f'"{f.etag}"'})

    def _cdn(self, sha256: str, head: bool) -> None:
        for repo in self.hub.repos.values():
            for f in repo.files.values():
                if f.sha256 == sha256:
                    return self._file(repo, f, head, {"ETag": f'"{sha256}"'})
        self._error(404, "NoSuchKey", head=head)

    def _file(self, repo: HubRepo, f: HubFile, head: bool, headers: dict[str, str]) -> None:
        start, end = 0, f.size - 1
        rng = self.headers.get("Range", "")
        status = 200
        if rng.startswith("bytes="):
            a, _, b = rng[6:].split(",")[0].partition("-")
            start = int(a) if a else max(f.size - int(b), 0)
            end = min(int(b), f.size - 1) if (a and b) else f.size - 1
            if start >= f.size:
                return self._error(416, "Range Not Satisfiable", head=head,
                                   extra={"Content-Range": f"bytes */{f.size}"})
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{f.size}"}
        length = end - start + 1
        self.send_response(status)
        for k, v in {**headers, "Accept-Ranges": "bytes", "Content-Length": str(length),
                     "Content-Type": "application/octet-stream"}.items():
            self.send_header(k, v)
        self.end_headers()
        record: dict[str, Any] = {
            "method": "HEAD" if head else "GET", "repo": repo.repo_id, "file": f.path,
            "start": start, "status": status, "sent": 0,
            "auth": "Authorization" in self.headers}
        with self.hub._lock:
            self.hub.requests.append(record)
        if head:
            return
        cut = self.hub._take_fault(f.path)
        with open(f.source, "rb") as src:
            src.seek(start)
            left = length
            while left > 0:
                n = min(CHUNK, left) if cut is None else min(CHUNK, left, cut - record["sent"])
                if n <= 0:  # the fault: vanish mid-body, like a pulled cable
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.hub._throttle(n)
                try:
                    self.wfile.write(src.read(n))
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                    return
                with self.hub._lock:
                    record["sent"] += n
                left -= n


def _info(repo: HubRepo, blobs: bool) -> dict[str, Any]:
    """GET /api/models/{repo}[/revision/{rev}] as the Hub answers it."""
    config: dict[str, Any] = {}
    if "config.json" in repo.files:
        try:
            full = json.loads(repo.files["config.json"].source.read_text())
            config = {"model_type": full.get("model_type"),
                      "architectures": full.get("architectures")}
        except ValueError:
            pass
    names = list(repo.files)
    tags = (["mlx", "safetensors"] if any(n.endswith(".safetensors") for n in names)
            else ["pytorch"] if any(n.endswith(".bin") for n in names) else [])
    tags += [config["model_type"]] if config.get("model_type") else []
    siblings = []
    for f in repo.files.values():
        s: dict[str, Any] = {"rfilename": f.path}
        if blobs:
            s.update(size=f.size, blobId=f.listed_etag or f.git_sha1)
            if f.lfs:
                s["lfs"] = {"size": f.size, "sha256": f.etag, "pointerSize": 134}
        siblings.append(s)
    return {"_id": repo.commit[:24], "id": repo.repo_id, "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0], "sha": repo.listed_sha or repo.commit,
            "lastModified": "2025-01-01T00:00:00.000Z",
            "createdAt": "2025-01-01T00:00:00.000Z",
            "private": repo.private, "gated": repo.gated, "disabled": False,
            "downloads": 0, "likes": 0, "tags": tags, "pipeline_tag": "text-generation",
            "library_name": "mlx" if "mlx" in tags else None, "config": config,
            "siblings": siblings, "usedStorage": sum(f.size for f in repo.files.values())}


def url_path(repo_id: str, rev: str, path: str) -> str:
    return f"/{repo_id}/resolve/{quote(rev, safe='')}/{quote(path)}"
