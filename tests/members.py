"""Talking to a node's cluster port as a member would: TLS with the cluster's certificate,
requests signed for that node, answers checked. Tests use it to reach the peer routes
directly, and to play a member that misbehaves (it holds the secret)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from engine.cluster.auth import HELLO, check_answer, check_body, sign
from engine.cluster.tls import client_context


class Member:
    """A client of one node's cluster port holding `secret`, as node `node_id`."""

    def __init__(self, cluster_url: str, secret: str, node_id: str = "test-member"):
        self.url, self.secret, self.me = cluster_url.rstrip("/"), secret, node_id
        self.http = httpx.Client(base_url=self.url, verify=client_context(secret),
                                 timeout=30)
        self.node = ""  # the node's id, once its hello proved it

    def __enter__(self) -> Member:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def signed(self, method: str, path: str, body: bytes = b"", to: str | None = None,
               **kw: Any) -> dict[str, str]:
        """Headers that sign a request for the node (or for `to`)."""
        if to is None:
            to = self.node_id()
        return sign(self.secret, self.me, method, path, body, to=to, **kw)

    def node_id(self) -> str:
        if not self.node:
            h = sign(self.secret, self.me, "GET", HELLO)
            r = self.http.get(HELLO, headers=h)
            r.raise_for_status()
            check_answer(self.secret, self.me, h, r.status_code, r.headers)
            self.node = r.json()["id"]
        return self.node

    def send(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> httpx.Response:
        """A request with exactly `headers` (none: signed for this node)."""
        raw = b"" if body is None else json.dumps(body).encode()
        h = self.signed(method, path, raw) if headers is None else headers
        return self.http.request(method, path, content=raw or None,
                                 headers={"Content-Type": "application/json", **h})

    def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """A signed request whose answer must prove the node holds the secret."""
        raw = b"" if body is None else json.dumps(body).encode()
        h = self.signed(method, path, raw)
        r = self.http.request(method, path, content=raw or None,
                              headers={"Content-Type": "application/json", **h})
        check_answer(self.secret, self.me, h, r.status_code, r.headers, self.node)
        check_body(r.headers, r.content)
        return r
