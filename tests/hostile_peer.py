"""A stranger on the network: a real aiohttp server, in a process of its own, that knows no
cluster secret and does what an attacker would. It answers a node's polls as a Shoal node
would (a made-up id, a made-up ready instance of any model it is told to claim), offers a
hostile file plan to pulls, answers chat requests with its own text, and records every
request it receives (so a test can see whether a prompt ever reached it, and has captured
requests to replay). It serves plain HTTP, or TLS with a certificate of its own. Given the
secret (HOSTILE_SECRET), it is a member gone bad instead: it speaks the cluster's TLS and
signs its answers, and still serves hostile file plans and, as a prefill node, KV frames
that lie.

Run: python tests/hostile_peer.py PORT RECORD_FILE [--tls] [--claim MODEL ...]
Tests use HostilePeer below, which starts it and always stops it."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STOLEN = "the stranger's own answer"
EVIL_INDEX_REVISION = "a" * 40


def node_info(claims: list[str], node_id: str = "stranger-node") -> dict:
    """What a real node answers to GET /shoal/node, made up: it claims a ready instance of
    every model in `claims`, so a node that believes it would relay those models' chats."""
    return {"id": node_id, "name": "stranger", "version": "0.1.0",
            "mlx_version": None, "state": "idle", "models": claims, "links": [],
            "instances": [{"id": f"evil{i:08d}", "model": m, "strategy": "pipeline",
                           "state": "ready", "reason": None,
                           "ranks": [{"rank": 0, "node": "stranger-node"}]}
                          for i, m in enumerate(claims)],
            "followers": []}


def hostile_index(repo: str) -> list[dict]:
    """A file plan whose names walk out of the cache (CVE-2024-37032's class)."""
    files = [{"path": "../../../../../../tmp/shoal-pwned", "size": 5, "etag": "0" * 64},
             {"path": "/tmp/shoal-pwned-abs", "size": 5, "etag": "1" * 64},
             {"path": "config.json", "size": 5, "etag": "../../../../tmp/shoal-etag"}]
    return [{"repo": repo, "revision": EVIL_INDEX_REVISION, "refs": ["main"],
             "files": files}]


def serve(port: int, record: Path, tls: bool, claims: list[str], secret: str = "") -> None:
    from aiohttp import web

    verifier = None
    if secret:  # a member gone bad: it proves the secret like any member
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from engine.cluster.auth import Verifier
        verifier = Verifier(secret, "evil-member")

    prefills = [0]

    def keep(request: web.Request, body: bytes) -> None:
        with record.open("a") as f:
            f.write(json.dumps({"method": request.method, "path": request.path_qs,
                                "headers": dict(request.headers),
                                "body": body.decode(errors="replace")}) + "\n")

    async def any_route(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        keep(request, body)
        resp = answer(request)
        if verifier is not None:
            caller = verifier.verify(request.method, request.path_qs, request.headers, body)
            whole = resp.body if isinstance(resp.body, bytes) else b""
            resp.headers.update(verifier.answer_headers(caller, resp.status, whole))
        return resp

    def answer(request: web.Request) -> web.Response:
        path = request.path
        if path in ("/shoal/node", "/shoal/peer/hello"):
            info = node_info(claims, "evil-member" if secret else "stranger-node")
            if secret and claims:  # a member serving the model alone: a prefill node
                info["serving"] = {"model": claims[0], "strategy": "single", "ready": True,
                                   "nodes": ["evil-member"]}
            return web.json_response(info)
        if path == "/shoal/peer/files-index":
            return web.json_response(hostile_index(request.query.get("repo", "")))
        if path.startswith("/shoal/peer/files/"):
            return web.Response(body=b"pwned")
        if path == "/shoal/peer/prefill":  # KV frames that lie, then a bomb of a header
            prefills[0] += 1
            if prefills[0] % 2:
                head = json.dumps({"kind": "begin", "made_by": "evil", "tokens": [1],
                                   "layers": ["KVCache"]}).encode()
                end = json.dumps({"kind": "end", "seconds": 0}).encode()
                return web.Response(body=b"".join(len(h).to_bytes(4, "big") + h
                                                  for h in (head, end)))
            return web.Response(body=(1 << 31).to_bytes(4, "big") + b"{" * 4096)
        if path == "/health":
            return web.json_response({"ok": True})
        if path.startswith("/v1/chat/completions"):
            return web.json_response({
                "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": STOLEN}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_route)
    ctx = None
    if secret:
        from engine.cluster.tls import server_context
        ctx = server_context(secret)
    elif tls:  # a certificate of its own: self-signed, as any stranger can make
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as d:
            from certs import self_signed
            cert, key = self_signed(Path(d), "Shoal cluster")
            ctx.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, print=None)


class HostilePeer:
    """The stranger as a child process on a free loopback port."""

    def __init__(self, folder: Path, tls: bool = False, claims: tuple[str, ...] = (),
                 secret: str = ""):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.record = folder / f"stranger-{self.port}.jsonl"
        self.record.touch()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(self.port), str(self.record),
             *(["--tls"] if tls else []), *(a for m in claims for a in ("--claim", m))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "HOSTILE_SECRET": secret})  # never argv
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("the hostile peer didn't start") from None
                time.sleep(0.1)
        raise TimeoutError("the hostile peer didn't listen in 30 s")

    def received(self) -> list[dict]:
        """Every request it got, in order."""
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("record", type=Path)
    p.add_argument("--tls", action="store_true")
    p.add_argument("--claim", action="append", default=[])
    a = p.parse_args()
    serve(a.port, a.record, a.tls, a.claim, os.environ.get("HOSTILE_SECRET", ""))
