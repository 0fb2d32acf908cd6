"""The engine's type hints hold: mypy over engine/ finds nothing (STYLE: a type checker in
CI)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nodes import ROOT


def test_engine_type_checks():
    pytest.importorskip("mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", "engine"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
