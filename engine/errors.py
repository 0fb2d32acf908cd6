"""The one exception tree. Every failure a user can cause is a ShoalError with a message
that says what happened and what to do; the HTTP layer maps it once to a status code and
an OpenAI-shaped error body, the GUI once to a dialog."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None
    node: NotRequired[str]  # Shoal's own: the cluster node to blame


class ErrorBody(TypedDict):
    """OpenAI's error body, which every Shoal route answers a failure with."""
    error: ErrorDetail


class ShoalError(Exception):
    """Base of every error Shoal reports to a user."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 node: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.node = node  # the cluster node the failure is on, where one is to blame
        if code is not None:
            self.code = code

    def to_openai(self) -> ErrorBody:
        """The OpenAI error body, with "node" (its id) when a cluster node is to blame."""
        detail: ErrorDetail = {"message": self.message, "type": self.type,
                               "param": self.param, "code": self.code}
        if self.node:
            detail["node"] = self.node
        return {"error": detail}

    @classmethod
    def from_openai(cls, body: dict[str, Any], status: int) -> ShoalError:
        """Rebuild the most specific error from an error body (used by the client)."""
        err = body.get("error") or {}
        code = err.get("code")
        for sub in _all_subclasses(ShoalError):
            if sub.code is not None and sub.code == code:
                return sub(err.get("message", ""), param=err.get("param"),
                           node=err.get("node"))
        e = cls(err.get("message") or f"HTTP {status}", param=err.get("param"), code=code,
                node=err.get("node"))
        e.status = status
        return e


def _all_subclasses(cls: type[ShoalError]) -> list[type[ShoalError]]:
    out: list[type[ShoalError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


class BadRequest(ShoalError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class ContextTooLong(BadRequest):
    code = "context_length_exceeded"


class Unauthorized(ShoalError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFound(ShoalError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class UnsupportedModel(BadRequest):
    """A model file Shoal can't use (architecture, quantization type, format)."""
    code = "unsupported_model"


class CorruptModel(ShoalError):
    """A model file that is truncated or damaged; the message names the file."""
    status = 500
    code = "corrupt_model"


class InsufficientMemory(ShoalError):
    status = 507
    code = "insufficient_memory"


class Busy(ShoalError):
    status = 503
    code = "busy"


class Overloaded(Busy):
    """Every stream is taken and the queue wait ran out; the client may retry later."""
    code = "overloaded"
    retry_after = 5  # seconds, sent as Retry-After


class WorkerFailed(ShoalError):
    """The worker process died or stopped answering; the next request starts a new one."""
    status = 500
    code = "worker_failed"


class PeerUnreachable(ShoalError):
    status = 502
    code = "peer_unreachable"


class ShardMismatch(ShoalError):
    status = 409
    code = "shard_mismatch"


class Cancelled(ShoalError):
    status = 499
    code = "cancelled"
