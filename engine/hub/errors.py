"""Download errors, in the one tree of engine.errors, and the one place where
huggingface_hub's exceptions become messages that say what to do."""

from __future__ import annotations

from engine.errors import ModelNotFound, PeerUnreachable, ShoalError, UnsupportedModel

TOKEN_HINT = ("create one at https://huggingface.co/settings/tokens and enter it with "
              "`shoal models login` (or in the app's settings)")


class GatedModel(ShoalError):
    """A gated repository and no token, or a token without access to it."""
    status = 403
    type = "permission_error"
    code = "gated_model"


class TokenRejected(ShoalError):
    """The Hub refused the Hugging Face token (revoked, expired or mistyped)."""
    status = 403
    type = "permission_error"
    code = "hf_token_rejected"


class HubUnreachable(PeerUnreachable):
    """The Hub (or its CDN) could not be reached, or the connection dropped for good."""
    code = "hub_unreachable"


class HubOffline(ModelNotFound):
    """HF_HUB_OFFLINE is set and the files are not all in the cache."""
    code = "hub_offline"


class UnsafeName(ShoalError):
    """A name from the Hub or a neighbour (file path, revision, commit, etag) that could
    reach outside its folder in the cache, or isn't the shape the Hub uses: the pull is
    refused and nothing is written. The message names the source and the name."""
    status = 502
    code = "unsafe_name"


class InsufficientDisk(ShoalError):
    status = 507
    code = "insufficient_disk"


def hub_error(e: BaseException, repo_id: str, revision: str, endpoint: str,
              token_given: bool) -> ShoalError:
    """The ShoalError a user should see for an exception raised by huggingface_hub."""
    from huggingface_hub import errors as hf

    if isinstance(e, ShoalError):
        return e
    page = f"https://huggingface.co/{repo_id}"
    if isinstance(e, hf.GatedRepoError):
        if token_given:
            return GatedModel(f"{repo_id} is gated and your Hugging Face account has not been "
                              f"granted access yet: accept its conditions at {page}, wait for "
                              "approval if it asks for one, then pull again.")
        return GatedModel(f"{repo_id} is gated: accept its conditions at {page}, then enter a "
                          f"Hugging Face token: {TOKEN_HINT}.")
    if isinstance(e, hf.RevisionNotFoundError):
        return ModelNotFound(f"{repo_id} has no revision '{revision}'. Leave the revision "
                             "empty for the latest one.", param="revision")
    if isinstance(e, hf.RemoteEntryNotFoundError):
        return ModelNotFound(f"A file of {repo_id} is missing on the Hub ({e}). The "
                             "repository may have changed: pull again.")
    if isinstance(e, hf.RepositoryNotFoundError):
        extra = ("your token may not give access to it" if token_given else
                 f"if it is private, enter a Hugging Face token: {TOKEN_HINT}")
        return ModelNotFound(f"There is no model '{repo_id}' on the Hugging Face Hub "
                             f"({endpoint}). Check the name (for example "
                             f"mlx-community/Llama-3.2-1B-Instruct-4bit); {extra}.",
                             param="repo")
    if isinstance(e, hf.OfflineModeIsEnabled):
        return HubOffline(f"HF_HUB_OFFLINE is set, so {repo_id} can't be fetched from the "
                          "Hub. Unset it, or copy the model from a node that has it.")
    if isinstance(e, hf.HfHubHTTPError):
        status = e.response.status_code if e.response is not None else 0
        if status == 401 or (status == 403 and token_given):
            return TokenRejected(f"The Hugging Face Hub refused your token ({status}): it "
                                 "was revoked, has expired or lacks read access; "
                                 f"{TOKEN_HINT}.")
        if status == 429 or status >= 500:
            return HubUnreachable(f"The Hugging Face Hub is busy or down (HTTP {status}) "
                                  f"while fetching {repo_id}. Try again in a few minutes; "
                                  "finished files are kept.")
        return ShoalError(f"The Hugging Face Hub refused the request for {repo_id} "
                          f"(HTTP {status}): {e}")
    if _is_transport_error(e) or isinstance(e, (ConnectionError, TimeoutError)):
        return HubUnreachable(f"The connection to the Hugging Face Hub ({endpoint}) failed "
                              f"while fetching {repo_id}: {e or type(e).__name__}. Check the "
                              "network and pull again: finished bytes are kept and the "
                              "download resumes.")
    return ShoalError(f"Downloading {repo_id} failed: {e}")


def _is_transport_error(e: BaseException) -> bool:
    try:
        import httpx2
        if isinstance(e, httpx2.TransportError):
            return True
    except ImportError:  # huggingface_hub < 2 uses httpx
        pass
    try:
        import httpx
        return isinstance(e, httpx.TransportError)
    except ImportError:
        return False


def not_mlx(repo_id: str, names: list[str]) -> UnsupportedModel:
    """A repository without the config.json + safetensors weights mlx-lm loads."""
    formats = sorted({n.rsplit(".", 1)[-1] for n in names
                      if n.endswith((".bin", ".gguf", ".pt", ".pth", ".onnx", ".h5",
                                     ".msgpack", ".safetensors"))})
    has = f" (it has {', '.join('.' + f for f in formats)} files)" if formats else ""
    hint = ("import a .gguf file with `shoal models import FILE.gguf`, or look for an MLX "
            "conversion on https://huggingface.co/mlx-community")
    if "config.json" not in names:
        return UnsupportedModel(f"{repo_id} is not a model Shoal can run: it has no "
                                f"config.json{has}. Try an MLX model instead: {hint}.",
                                param="repo")
    return UnsupportedModel(f"{repo_id} has no safetensors weights{has}, so MLX can't load "
                            f"it. Try an MLX conversion instead: {hint}.", param="repo")
