"""scripts/setup's choice of MLX build (scripts/mlx_build.py) from nvidia-smi output recorded
on real cards (tests/fixtures/nvidia-smi/), and the script itself as setup runs it."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SMI = ROOT / "tests" / "fixtures" / "nvidia-smi"
SCRIPT = ROOT / "scripts" / "mlx_build.py"
spec = importlib.util.spec_from_file_location("mlx_build", SCRIPT)
assert spec and spec.loader
mlx_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mlx_build)


@pytest.mark.parametrize("name, build", [
    ("h100-80gb-hbm3.csv", "cuda13"),  # driver 590.48.01, compute 9.0
    ("rtx-4080-super.csv", "cuda13"),  # driver 595.71.05, compute 8.9
    ("l40s.csv", "cuda13"),
])
def test_recorded_cards_get_the_cuda_build_their_driver_runs(name, build):
    got, why = mlx_build.choose((SMI / name).read_text())
    assert got == build and "driver" in why


def test_no_driver_version_no_driver_or_asked_for_cpu():
    # the GB10 recording asked nvidia-smi for memory only: no driver to go by
    assert mlx_build.choose((SMI / "gb10-dgx-spark.csv").read_text())[0] == "cpu"
    build, why = mlx_build.choose(None)
    assert build == "cpu" and "no NVIDIA driver" in why
    assert mlx_build.choose((SMI / "h100-80gb-hbm3.csv").read_text(), "cpu") == \
        ("cpu", "SHOAL_MLX=cpu")
    assert mlx_build.choose(None, "cuda12")[0] == "cuda12"
    build, why = mlx_build.choose(None, "rocm")
    assert build == "cpu" and "'rocm'" in why
    for junk in ("", "garbage\n", "driver_version, compute_cap\n", "\x00\xff"):
        assert mlx_build.choose(junk)[0] == "cpu"


def test_older_drivers_and_cards():
    # 2x RTX 4090 on driver 550.163.01, as recorded in https://github.com/RLinf/RLinf/issues/255
    assert mlx_build.by_driver(550, (8, 9))[0] == "cuda12"
    build, why = mlx_build.by_driver(590, (6, 0))  # a Tesla P100 on a new driver
    assert build == "cuda12" and "6.0" in why
    build, why = mlx_build.by_driver(470, (8, 6))
    assert build == "cpu" and "too old" in why


def fake_smi(tmp_path: Path, body: str) -> dict[str, str]:
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.parametrize("body, env, out", [
    (f'cat "{SMI / "h100-80gb-hbm3.csv"}"\n', {}, "cuda13"),
    (f'cat "{SMI / "h100-80gb-hbm3.csv"}"\n', {"SHOAL_MLX": "cpu"}, "cpu"),
    ("echo 'NVIDIA-SMI has failed'; exit 9\n", {}, "cpu"),
])
def test_the_script_as_setup_runs_it(tmp_path, body, env, out):
    p = subprocess.run([sys.executable, str(SCRIPT)], env={**fake_smi(tmp_path, body), **env},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == out + "\n"
    assert p.stderr.startswith(f"MLX build: {out} (")
