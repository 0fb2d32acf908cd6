"""Node-to-node authentication, both ways, on every exchange.

A request is signed with the cluster secret (HMAC-SHA256 over method, path, the sender's
and the receiver's node ids, time, nonce and body hash), so it can't be forged, replayed
at the same node (nonces are remembered) or spent at another (the receiver's id is in it).
The answer is signed too, over its status, its body hash, both ids and the nonce of the
request it answers, so a host without the secret can't pose as a member, and an answer
captured once can't stand for another. The one request sent before the receiver's id is
known is `GET /shoal/peer/hello`, whose answer says only that id.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.errors import Unauthorized

MAX_SKEW_S = 30.0
HELLO = "/shoal/peer/hello"  # the only route a request may reach without the receiver's id
NODE, TO, TIME, NONCE, SIGNATURE = ("X-Shoal-Node", "X-Shoal-To", "X-Shoal-Time",
                                    "X-Shoal-Nonce", "X-Shoal-Signature")
HEADERS = (NODE, TIME, NONCE, SIGNATURE)
ANSWER_SIGNATURE, BODY_HASH = "X-Shoal-Answer-Signature", "X-Shoal-Body-Sha256"
STREAMED = "-"  # the body hash of an answer streamed as it is made (TLS keeps it whole)


class NotInCluster(Unauthorized):
    code = "not_in_cluster"


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _mac(secret: str, *parts: str) -> str:
    return hmac.new(secret.encode(), "\n".join(parts).encode(), hashlib.sha256).hexdigest()


def _request_mac(secret: str, method: str, path: str, sender: str, receiver: str, ts: str,
                 nonce: str, digest: str) -> str:
    return _mac(secret, "request", method.upper(), path, sender, receiver, ts, nonce, digest)


def _answer_mac(secret: str, status: int, nonce: str, responder: str, requester: str,
                digest: str) -> str:
    return _mac(secret, "answer", str(status), nonce, responder, requester, digest)


def sign(secret: str, node_id: str, method: str, path: str, body: bytes = b"",
         now: float | None = None, to: str = "") -> dict[str, str]:
    """Headers that prove this request comes from member `node_id` and is meant for member
    `to` (empty only for the hello, whose receiver isn't known yet)."""
    ts = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(12)
    return {NODE: node_id, TO: to, TIME: ts, NONCE: nonce,
            SIGNATURE: _request_mac(secret, method, path, node_id, to, ts, nonce,
                                    body_hash(body))}


@dataclass(frozen=True)
class Caller:
    """A request that proved itself: who sent it, and the nonce its answer is bound to."""
    node: str
    nonce: str


class Verifier:
    """Checks requests' signatures (remembering recent nonces, so a captured request
    can't be replayed inside the time window) and signs this node's answers. `me` is this
    node's id, read at each call (a node whose id collided gets a new one)."""

    def __init__(self, secret: str, me: Callable[[], str] | str = "",
                 window_s: float = MAX_SKEW_S):
        self.secret = secret
        self._me = me if callable(me) else (lambda: str(me))
        self.window_s = window_s
        self._seen: OrderedDict[str, float] = OrderedDict()

    @property
    def me(self) -> str:
        return self._me()

    def verify(self, method: str, path: str, headers: Mapping[str, str], body: bytes,
               now: float | None = None) -> Caller:
        """The caller, or NotInCluster saying what was wrong."""
        now = time.time() if now is None else now
        node, ts, nonce, sig = (headers.get(h) for h in HEADERS)
        to = headers.get(TO, "")
        if not (node and ts and nonce and sig):
            raise NotInCluster("This request is not signed with the cluster secret: only "
                               "nodes of this cluster may call it.")
        try:
            age = abs(now - float(ts))
        except ValueError:
            raise NotInCluster("The request's time stamp is not a number.") from None
        if age > self.window_s:
            raise NotInCluster(f"The request is {age:.0f} s off this node's clock (more than "
                               f"{self.window_s:.0f} s): check both machines' clocks.")
        want = _request_mac(self.secret, method, path, node, to, ts, nonce, body_hash(body))
        if not hmac.compare_digest(sig.encode(), want.encode()):
            raise NotInCluster("The request is signed with another cluster secret: that "
                               "node is not in this cluster.")
        if to != self.me and not (to == "" and method.upper() == "GET"
                                  and path.split("?")[0] == HELLO):
            raise NotInCluster("The request was signed for another node (a replay, or the "
                               "sender knows this node by an old id).", code="wrong_node")
        self._forget(now)
        if nonce in self._seen:
            raise NotInCluster("This request was already received once (a replay).")
        self._seen[nonce] = now
        return Caller(node, nonce)

    def answer_headers(self, caller: Caller, status: int, body: bytes | None
                       ) -> dict[str, str]:
        """The headers that sign this node's answer to `caller` (body None: streamed)."""
        digest = STREAMED if body is None else body_hash(body)
        me = self.me
        return {NODE: me, BODY_HASH: digest,
                ANSWER_SIGNATURE: _answer_mac(self.secret, status, caller.nonce, me,
                                              caller.node, digest)}

    def _forget(self, now: float) -> None:
        while self._seen:
            nonce, t = next(iter(self._seen.items()))
            if now - t <= 2 * self.window_s:
                break
            self._seen.popitem(last=False)


def check_answer(secret: str, me: str, request: Mapping[str, str], status: int,
                 headers: Mapping[str, str], expect: str = "") -> str:
    """The responder's node id, once its answer to `request` (the headers sign() made)
    proves it holds the secret (and, given `expect`, that it is that node); else
    NotInCluster. The body hash it declares is checked by the caller (check_body)."""
    responder, digest, sig = (headers.get(h) for h in (NODE, BODY_HASH, ANSWER_SIGNATURE))
    if not (responder and digest and sig):
        raise NotInCluster("It answered without proving it holds this cluster's secret "
                           "(an unsigned answer).")
    want = _answer_mac(secret, status, request[NONCE], responder, me, digest)
    if not hmac.compare_digest(sig.encode(), want.encode()):
        raise NotInCluster("Its answer is not signed with this cluster's secret.")
    if expect and responder != expect:
        raise NotInCluster(f"The answer came from node {responder}, not {expect}.",
                           code="wrong_node")
    return responder


def check_body(headers: Mapping[str, str], body: bytes) -> None:
    """The body is the one the answer's signature covers (a whole answer must declare
    its hash; only streamed answers may say '-')."""
    digest = headers.get(BODY_HASH, "")
    if digest == STREAMED or not hmac.compare_digest(digest.encode(),
                                                     body_hash(body).encode()):
        raise NotInCluster("Its answer's body is not the one its signature covers.")


def pairing_code(secret: str) -> str:
    """A short code derived from the secret, shown to the user for reading it aloud or
    checking that two machines hold the same secret (8 characters, base32)."""
    import base64
    raw = hmac.new(secret.encode(), b"shoal pairing code", hashlib.sha256).digest()[:5]
    code = base64.b32encode(raw).decode()
    return f"{code[:4]}-{code[4:]}"
