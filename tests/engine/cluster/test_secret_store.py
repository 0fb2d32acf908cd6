"""The cluster secret's storage: keyring when it works, a private file otherwise, and a
keyring that hangs never hangs the node."""

from __future__ import annotations

import stat
import sys
import time
import types

from engine.cluster import secret as secret_mod
from engine.cluster.auth import pairing_code
from engine.cluster.secret import SecretStore


def test_without_keyring_the_secret_is_a_private_file(tmp_path):
    store = SecretStore(tmp_path, use_keyring=False)
    value = store.ensure()
    assert store.ensure() == value  # stable
    f = tmp_path / "cluster-secret"
    assert f.read_text() == value
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert "readable only by you" in store.where


def test_a_hanging_keyring_falls_back_within_bounds(tmp_path, monkeypatch):
    # A stand-in keyring module whose calls hang, like a locked keyring on a headless
    # session (the real one can't be made to hang on purpose here).
    fake = types.SimpleNamespace(get_password=lambda *a: time.sleep(30),
                                 set_password=lambda *a: time.sleep(30))
    monkeypatch.setitem(sys.modules, "keyring", fake)
    monkeypatch.setattr(secret_mod, "KEYRING_TIMEOUT_S", 0.5)
    store = SecretStore(tmp_path, use_keyring=True)
    t0 = time.monotonic()
    value = store.ensure("joined-secret")
    assert time.monotonic() - t0 < 3
    assert value == "joined-secret"
    assert (tmp_path / "cluster-secret").read_text() == "joined-secret"


def test_pairing_code_is_short_and_stable():
    code = pairing_code("some secret")
    assert code == pairing_code("some secret") and len(code) == 9 and code[4] == "-"
    assert code != pairing_code("another secret")
