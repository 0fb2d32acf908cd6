"""The Hugging Face token (keyring first, a private file otherwise, never a log line) and
`shoal models search|pull|rm|login` against the local Hub."""

from __future__ import annotations

import argparse
import io
import logging
import stat
from pathlib import Path

import pytest
from hub_models import GATED, SHARDED, TOKEN

from engine.errors import ShoalError
from engine.hub.cli_models import add_models_parsers
from engine.hub.errors import TokenRejected
from engine.hub.token import TokenStore


def _cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--home")
    add_models_parsers(p.add_subparsers(dest="mcmd"))
    a = p.parse_args(list(argv))
    return a.func(a)


def test_token_file_fallback_is_private(tmp_path: Path) -> None:
    store = TokenStore(tmp_path, use_keyring=False)
    assert store.get() is None
    store.set(TOKEN)
    assert store.get() == TOKEN
    assert stat.S_IMODE((tmp_path / "hf-token").stat().st_mode) == 0o600
    store.clear()
    assert store.get() is None and not (tmp_path / "hf-token").exists()


def test_token_goes_to_the_keyring_when_one_works(tmp_path: Path) -> None:
    import keyring
    from keyring.backend import KeyringBackend

    class Memory(KeyringBackend):
        priority = 1  # type: ignore[assignment]
        data: dict = {}

        def get_password(self, service, user):
            return self.data.get((service, user))

        def set_password(self, service, user, password):
            self.data[(service, user)] = password

        def delete_password(self, service, user):
            self.data.pop((service, user), None)
    before = keyring.get_keyring()
    keyring.set_keyring(Memory())
    try:
        store = TokenStore(tmp_path, use_keyring=True)
        store.set(TOKEN)
        assert store.where == "the system keyring" and not (tmp_path / "hf-token").exists()
        assert TokenStore(tmp_path, use_keyring=True).get() == TOKEN
    finally:
        keyring.set_keyring(before)


def test_login_checks_the_token_and_never_logs_it(hub, tmp_path: Path, capsys,
                                                  caplog, monkeypatch) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr("sys.stdin", io.StringIO(TOKEN + "\n"))
    assert _cli("--home", str(tmp_path), "login") == 0
    out = capsys.readouterr().out
    assert "belongs to tester" in out and TOKEN not in out
    assert TokenStore(tmp_path).get() == TOKEN
    hub.revoke(TOKEN)
    monkeypatch.setattr("sys.stdin", io.StringIO(TOKEN + "\n"))
    with pytest.raises(TokenRejected):
        _cli("--home", str(tmp_path), "login")
    assert TOKEN not in caplog.text


def test_pull_search_and_rm_from_the_command_line(hub, hf_env: Path, tmp_path: Path,
                                                  capsys, monkeypatch) -> None:
    home = tmp_path / "home"
    TokenStore(home).set(TOKEN)
    assert _cli("--home", str(home), "pull", GATED) == 0  # the stored token is used
    assert "is in" in capsys.readouterr().out
    assert _cli("--home", str(home), "search", "tiny") == 0
    out = capsys.readouterr().out
    assert GATED in out and "hf-cache" in out and SHARDED in out  # local and from the Hub
    assert _cli("--home", str(home), "rm", GATED) == 0
    assert "Deleted" in capsys.readouterr().out
    with pytest.raises(ShoalError, match="no model"):
        _cli("--home", str(home), "rm", GATED)
