"""The Hugging Face token: entered once, kept in the system keyring (or, where no keyring
works, in a file readable only by this user in Shoal's home), never in a config file or a
log. Every keyring call is bounded in time, as for the cluster secret."""

from __future__ import annotations

from pathlib import Path

from engine.cluster.secret import KeyStore

ACCOUNT = "huggingface-token"


class TokenStore(KeyStore):
    """get/set/clear the Hugging Face token of one Shoal home; `where` says where it is."""

    def __init__(self, home: Path, use_keyring: bool | None = None):
        super().__init__(home, ACCOUNT, "hf-token", "the Hugging Face token", use_keyring)
        self.where = "not stored"

    def set(self, token: str) -> None:
        token = token.strip()
        if not token:
            raise ValueError("empty token")
        super().set(token)


def mask(token: str | None) -> str:
    """How a token may appear on screen: its kind and last four characters."""
    if not token:
        return "none"
    return f"{token[:3]}…{token[-4:]}" if len(token) > 10 else "…"
