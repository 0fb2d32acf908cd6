"""Start at login: the login item each platform reads, written and removed in a home of
the test's own (never the user's)."""

from __future__ import annotations

import plistlib
import shlex
import sys

from app import autostart


def test_macos_launch_agent(tmp_path):
    path = autostart.enable(tmp_path / "shoal-home", system="darwin", home=tmp_path)
    assert path == tmp_path / "Library/LaunchAgents/org.shoal.app.plist"
    plist = plistlib.loads(path.read_bytes())
    assert plist["RunAtLoad"] is True and plist["Label"] == "org.shoal.app"
    assert plist["ProgramArguments"][:3] == [sys.executable, "-m", "app"]
    assert str(tmp_path / "shoal-home") in plist["ProgramArguments"]
    assert autostart.enabled("darwin", tmp_path)
    autostart.disable("darwin", tmp_path)
    assert not autostart.enabled("darwin", tmp_path)


def test_linux_autostart_entry(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    path = autostart.enable(tmp_path / "h", system="linux", home=tmp_path)
    assert path == tmp_path / ".config/autostart/shoal.desktop"
    lines = dict(ln.split("=", 1) for ln in path.read_text().splitlines() if "=" in ln)
    assert lines["Type"] == "Application"
    assert shlex.split(lines["Exec"])[1:] == ["-m", "app", "--home", str(tmp_path / "h")]
    autostart.disable("linux", tmp_path)
    assert not path.exists()


def test_menubar_only_is_a_no_op_off_macos():
    if sys.platform != "darwin":
        assert autostart.set_menubar_only(True) is False
