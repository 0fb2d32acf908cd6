"""The code passes ruff with the rule set in pyproject.toml (pycodestyle, pyflakes, import
order, bugbear, pyupgrade), so findings are fixed where they are made."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nodes import ROOT


def test_ruff_finds_nothing():
    pytest.importorskip("ruff")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                        "--output-format", "concise", "."], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]
