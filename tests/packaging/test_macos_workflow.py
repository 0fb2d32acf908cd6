""".github/workflows/macos.yml can't run here (no Mac): it parses, runs on a hosted Apple
Silicon runner, and calls the project's own scripts in order: set up, build the app, the
self-test inside the built app (the path packaging/build writes), then the fast suite."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
from shoalpack import meta  # noqa: E402

WORKFLOW = ROOT / ".github" / "workflows" / "macos.yml"
APP_BINARY = f"dist/{meta.NAME}.app/Contents/MacOS/{meta.EXECUTABLE}"


def job() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"push", "pull_request"} <= set(triggers)
    [only] = doc["jobs"].values()
    return only


def commands(step: dict) -> list[list[str]]:
    """The step's shell commands, split as bash would (continued lines joined)."""
    script = step.get("run", "").replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in script.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_runs_on_a_hosted_apple_silicon_runner() -> None:
    runner = job()["runs-on"]
    m = re.fullmatch(r"macos-(\d+)", runner)  # -large and -intel are x86_64
    assert m and int(m[1]) >= 14, runner


def test_sets_up_builds_self_tests_the_app_then_runs_the_fast_suite() -> None:
    steps = job()["steps"]
    assert steps[0]["uses"].startswith("actions/checkout@")
    calls = [(i, c) for i, s in enumerate(steps) for c in commands(s)]

    def first(pred) -> int:
        return next(i for i, c in calls if pred(c))

    setup = first(lambda c: c == ["scripts/setup"])
    build = first(lambda c: c == ["packaging/build"])
    self_test = first(lambda c: APP_BINARY in c and "--self-test" in c)
    fast = first(lambda c: c == ["scripts/test", "--fast"])
    assert setup < build < self_test < fast
    assert steps[build]["env"]["SHOAL_BUILD_SELFTEST"] == "0"  # run once, as its own step
    [test_call] = [c for i, c in calls if i == self_test and "--self-test" in c]
    assert test_call[test_call.index("--home") + 1] == "$RUNNER_TEMP/shoal-home"  # not ~
    for script in ("scripts/setup", "packaging/build", "scripts/test"):
        assert os.access(ROOT / script, os.X_OK), script
