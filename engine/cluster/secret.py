"""Where Shoal's secrets live (the cluster secret, the API key, and through engine.hub.token
the Hugging Face token): the system keyring when one works, else a file readable only by
this user in the node's home. Every keyring call is bounded in time, because a
locked keyring on a headless session was seen to hang for over a minute."""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
SERVICE = "shoal"
KEYRING_TIMEOUT_S = 3.0


def _bounded(fn: Callable[[], Any], timeout: float | None = None) -> Any:
    """Run fn in a daemon thread; raise TimeoutError if it doesn't finish in time."""
    timeout = KEYRING_TIMEOUT_S if timeout is None else timeout
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed back to the caller below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"the keyring did not answer within {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def write_private(path: Path, text: str) -> None:
    """Write a file only this user can read, atomically (a temp file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def new_secret() -> str:
    return secrets.token_urlsafe(24)


class KeyStore:
    """One secret of one Shoal home: in the system keyring when one works, else in a file
    only this user can read; never both (one copy), never in a log. `where` says where."""

    def __init__(self, home: Path, account: str, filename: str, what: str,
                 use_keyring: bool | None = None):
        self.home = home
        self.file = home / filename
        self.account = account
        self.what = what  # for log lines: "the cluster secret", ...
        if use_keyring is None:
            use_keyring = os.environ.get("SHOAL_KEYRING", "1") != "0"
        self.use_keyring = use_keyring
        self.where = "not stored yet"

    def get(self) -> str | None:
        if self.use_keyring:
            try:
                import keyring
                value = _bounded(lambda: keyring.get_password(SERVICE, self.account))
                if value:
                    self.where = "the system keyring"
                    return value
            except Exception as e:  # NoKeyringError, locked keyring, timeout, ...
                self._fallback_note(e)
        try:
            value = self.file.read_text().strip()
        except FileNotFoundError:
            return None
        self.where = f"{self.file} (readable only by you)"
        return value or None

    def set(self, value: str) -> None:
        if self.use_keyring:
            try:
                import keyring
                _bounded(lambda: keyring.set_password(SERVICE, self.account, value))
                self.where = "the system keyring"
                self.file.unlink(missing_ok=True)
                return
            except Exception as e:
                self._fallback_note(e)
        write_private(self.file, value)
        self.where = f"{self.file} (readable only by you)"

    def clear(self) -> None:
        if self.use_keyring:
            try:
                import keyring
                _bounded(lambda: keyring.delete_password(SERVICE, self.account))
            except Exception as e:  # PasswordDeleteError when there was none
                log.debug("keyring delete: %s", type(e).__name__)
        self.file.unlink(missing_ok=True)
        self.where = "not stored"

    def _fallback_note(self, e: BaseException) -> None:
        self.use_keyring = False  # don't pay the timeout again on every call
        # the exception's type only: a backend's message could quote what it was given
        log.info("no usable keyring (%s); %s is kept in %s instead", type(e).__name__,
                 self.what, self.file)


class SecretStore(KeyStore):
    """The cluster secret of one node home."""

    def __init__(self, home: Path, use_keyring: bool | None = None):
        super().__init__(home, f"cluster-secret:{home.resolve()}", "cluster-secret",
                         "the cluster secret", use_keyring)

    def ensure(self, given: str | None = None) -> str:
        """The secret to use: `given` (stored for next time), the stored one, or a new one
        (this node starts a new cluster)."""
        if given:
            if given != self.get():
                self.set(given)
            return given
        current = self.get()
        if current:
            return current
        value = new_secret()
        self.set(value)
        log.info("created a new cluster secret, kept in %s", self.where)
        return value


class ApiKeyStore(KeyStore):
    """The API key the app's node requires of its clients (Settings → API)."""

    def __init__(self, home: Path, use_keyring: bool | None = None):
        super().__init__(home, f"api-key:{home.resolve()}", "api-key", "the API key",
                         use_keyring)
