"""The Hugging Face token: entered once, kept in the system keyring (or, where no keyring
works, in a file readable only by this user in Shoal's home), never in a config file or a
log. Every keyring call is bounded in time, as for the cluster secret."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engine.cluster.secret import SERVICE, _bounded, write_private

log = logging.getLogger(__name__)
ACCOUNT = "huggingface-token"


class TokenStore:
    """get/set/clear the Hugging Face token of one Shoal home; `where` says where it is."""

    def __init__(self, home: Path, use_keyring: bool | None = None):
        self.home = home
        self.file = home / "hf-token"
        if use_keyring is None:
            use_keyring = os.environ.get("SHOAL_KEYRING", "1") != "0"
        self.use_keyring = use_keyring
        self.where = "not stored"

    def get(self) -> str | None:
        if self.use_keyring:
            try:
                import keyring
                value = _bounded(lambda: keyring.get_password(SERVICE, ACCOUNT))
                if value:
                    self.where = "the system keyring"
                    return value
            except Exception as e:  # no backend, locked keyring, timeout
                self._fallback(e)
        try:
            value = self.file.read_text().strip()
        except FileNotFoundError:
            return None
        self.where = f"{self.file} (readable only by you)"
        return value or None

    def set(self, token: str) -> None:
        token = token.strip()
        if not token:
            raise ValueError("empty token")
        if self.use_keyring:
            try:
                import keyring
                _bounded(lambda: keyring.set_password(SERVICE, ACCOUNT, token))
                self.file.unlink(missing_ok=True)  # one copy only
                self.where = "the system keyring"
                return
            except Exception as e:
                self._fallback(e)
        write_private(self.file, token)
        self.where = f"{self.file} (readable only by you)"

    def clear(self) -> None:
        if self.use_keyring:
            try:
                import keyring
                _bounded(lambda: keyring.delete_password(SERVICE, ACCOUNT))
            except Exception as e:  # PasswordDeleteError when there was none
                log.debug("keyring delete: %s", type(e).__name__)
        self.file.unlink(missing_ok=True)
        self.where = "not stored"

    def _fallback(self, e: BaseException) -> None:
        self.use_keyring = False  # pay the timeout once, not on every call
        # the exception type only: a backend's message could quote what it was given
        log.info("no usable keyring (%s); the Hugging Face token is kept in %s instead",
                 type(e).__name__, self.file)


def mask(token: str | None) -> str:
    """How a token may appear on screen: its kind and last four characters."""
    if not token:
        return "none"
    return f"{token[:3]}…{token[-4:]}" if len(token) > 10 else "…"
