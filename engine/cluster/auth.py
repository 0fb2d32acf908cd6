"""Node-to-node authentication: every control request is signed with the cluster secret
(HMAC-SHA256 over method, path, time, nonce and body hash). A request that is unsigned,
signed with another secret, too old, or replayed is refused."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict

from engine.errors import Unauthorized

MAX_SKEW_S = 30.0
HEADERS = ("X-Shoal-Node", "X-Shoal-Time", "X-Shoal-Nonce", "X-Shoal-Signature")


class NotInCluster(Unauthorized):
    code = "not_in_cluster"


def _digest(secret: str, method: str, path: str, ts: str, nonce: str, body: bytes) -> str:
    msg = "\n".join((method.upper(), path, ts, nonce, hashlib.sha256(body).hexdigest()))
    return hmac.new(secret.encode(), msg.encode(), hashlib.sha256).hexdigest()


def sign(secret: str, node_id: str, method: str, path: str, body: bytes = b"",
         now: float | None = None) -> dict[str, str]:
    """Headers that prove this request comes from a member of the cluster."""
    ts = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(12)
    return {"X-Shoal-Node": node_id, "X-Shoal-Time": ts, "X-Shoal-Nonce": nonce,
            "X-Shoal-Signature": _digest(secret, method, path, ts, nonce, body)}


class Verifier:
    """Checks signatures and remembers recent nonces, so a captured request can't be
    replayed inside the time window."""

    def __init__(self, secret: str, window_s: float = MAX_SKEW_S):
        self.secret = secret
        self.window_s = window_s
        self._seen: OrderedDict[str, float] = OrderedDict()

    def verify(self, method: str, path: str, headers: dict[str, str], body: bytes,
               now: float | None = None) -> str:
        """The sender's node id, or NotInCluster saying what was wrong."""
        now = time.time() if now is None else now
        node, ts, nonce, sig = (headers.get(h) for h in HEADERS)
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
        if not hmac.compare_digest(sig, _digest(self.secret, method, path, ts, nonce, body)):
            raise NotInCluster("The request is signed with another cluster secret: that "
                               "node is not in this cluster.")
        self._forget(now)
        if nonce in self._seen:
            raise NotInCluster("This request was already received once (a replay).")
        self._seen[nonce] = now
        return node

    def _forget(self, now: float) -> None:
        while self._seen:
            nonce, t = next(iter(self._seen.items()))
            if now - t <= 2 * self.window_s:
                break
            self._seen.popitem(last=False)


def pairing_code(secret: str) -> str:
    """A short code derived from the secret, shown to the user for reading it aloud or
    checking that two machines hold the same secret (8 characters, base32)."""
    import base64
    raw = hmac.new(secret.encode(), b"shoal pairing code", hashlib.sha256).digest()[:5]
    code = base64.b32encode(raw).decode()
    return f"{code[:4]}-{code[4:]}"
