"""The few-rows shim in front of OpenBLAS (engine/platform/gemv_shim.c): built from source
once, kept only in a private folder, and the products it sends to sgemv are the same as
gemm's, checked in real MLX processes with the shim preloaded."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from engine.platform import cpu, gemv

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the preload is Linux's")

needs_build = pytest.mark.skipif(
    cpu.system_openblas() is None or gemv.shim() is None,
    reason="needs the system OpenBLAS and a C compiler")

# Products through MLX's CPU matmul, each against numpy in float64; the shim's counter
# says how many went through sgemv.
PRODUCTS = r"""
import ctypes, json, sys
import numpy as np
import mlx.core as mx
shim = ctypes.CDLL(sys.argv[1])
calls = lambda: ctypes.c_ulong.in_dll(shim, "shoal_gemv_calls").value
mx.random.seed(0)
K, N = 96, 200
W = mx.random.normal((N, K)); Wk = mx.random.normal((K, N)); col = mx.random.normal((K, 1))
Ws = mx.random.normal((3, N, K))
x = mx.random.normal((1, K)); xs = mx.random.normal((3, 1, K)); four = mx.random.normal((4, K))
cols = mx.random.normal((K, 3)); five = mx.random.normal((5, K))
c = mx.random.normal((1, N))
f64 = lambda a: np.array(a).astype(np.float64)
cases = {
    "x @ W.T": (lambda: x @ W.T, f64(x) @ f64(W).T),
    "x @ Wk": (lambda: x @ Wk, f64(x) @ f64(Wk)),
    "col.T @ W.T": (lambda: col.T @ W.T, f64(col).T @ f64(W).T),
    "x @ W[:, :64].T": (lambda: x[:, :64] @ W[:, :64].T, f64(x)[:, :64] @ f64(W)[:, :64].T),
    "addmm": (lambda: mx.addmm(c, x, W.T, alpha=0.5, beta=2.0),
              2.0 * f64(c) + 0.5 * f64(x) @ f64(W).T),
    "a row each": (lambda: xs @ Ws.transpose(0, 2, 1), f64(xs) @ f64(Ws).transpose(0, 2, 1)),
    "four rows": (lambda: four @ W.T, f64(four) @ f64(W).T),
    "cols.T @ Wk": (lambda: cols.T @ Wk, f64(cols).T @ f64(Wk)),
    "five rows": (lambda: five @ W.T, f64(five) @ f64(W).T),
}
out = {}
for name, (run, want) in cases.items():
    before = calls()
    got = run(); mx.eval(got)
    out[name] = {"err": float(np.abs(np.array(got) - want).max() / np.abs(want).max()),
                 "sgemv": calls() - before}
print(json.dumps(out))
"""


def _run(code: str, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@needs_build
@pytest.mark.parametrize("cache", [0, 8 << 20])
def test_few_row_products_go_to_sgemv_and_agree_with_numpy(cache):
    shim = gemv.shim()
    env = cpu.worker_env({**os.environ, "SHOAL_GEMV": "1",
                          "SHOAL_GEMV_CACHE_BYTES": str(cache)})
    assert env["LD_PRELOAD"].split(":")[:2] == [shim, cpu.system_openblas()]
    out = json.loads(_run(PRODUCTS, shim, env=env))
    for name, r in out.items():
        assert r["err"] < 1e-5, (name, r)
    for name in ("x @ W.T", "x @ Wk", "x @ W[:, :64].T", "addmm"):
        assert out[name]["sgemv"] == 1, (name, out[name])  # one row: always
    assert out["a row each"]["sgemv"] == 3  # one gemm call per matrix of the batch
    # up to four rows, row by row where the matrix fits in half the cache (76 KB here)
    assert out["four rows"]["sgemv"] == (4 if cache else 0)
    assert out["cols.T @ Wk"]["sgemv"] == (3 if cache else 0)
    assert out["five rows"]["sgemv"] == 0  # more stay with OpenBLAS's gemm


def test_last_level_cache_size_from_sysfs(tmp_path):
    for name, kind, level, size in (("index0", "Data", 1, "48K"),
                                    ("index1", "Instruction", 1, "32K"),
                                    ("index2", "Unified", 2, "2048K"),
                                    ("index3", "Unified", 3, "48M")):
        (tmp_path / name).mkdir()
        for f, v in (("type", kind), ("level", level), ("size", size)):
            (tmp_path / name / f).write_text(f"{v}\n")
    assert gemv.last_level_cache_bytes(tmp_path) == 48 << 20
    (tmp_path / "index3" / "size").write_text("garbage\n")
    assert gemv.last_level_cache_bytes(tmp_path) == 2 << 20
    assert gemv.last_level_cache_bytes(tmp_path / "missing") == 0


# cblas_sgemm called directly: beta 0 means c is not read, so garbage in it (MLX's output
# buffers are not cleared) must not come out.
NAN_IN_C = r"""
import ctypes, sys
import numpy as np
shim = ctypes.CDLL(sys.argv[1])
P, I, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
shim.cblas_sgemm.argtypes = [I] * 6 + [F, P, I, P, I, F, P, I]
a = np.ones((2, 3), np.float32); b = np.ones((4, 3), np.float32)
c = np.full((2, 4), np.nan, np.float32)
shim.cblas_sgemm(101, 111, 112, 2, 4, 3, 1.0, a.ctypes.data, 3, b.ctypes.data, 3, 0.0,
                 c.ctypes.data, 4)
print(c.tolist(), ctypes.c_ulong.in_dll(shim, "shoal_gemv_calls").value)
"""


@needs_build
def test_beta_zero_does_not_read_what_was_in_c():
    env = cpu.worker_env({**os.environ, "SHOAL_GEMV": "1", "SHOAL_GEMV_CACHE_BYTES": "1e6"})
    out = _run(NAN_IN_C, gemv.shim(), env=env).split("]] ")
    assert out == ["[[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0", "2\n"]  # both rows by gemv


@needs_build
def test_a_real_node_runs_its_worker_with_the_shim(tmp_path, tiny_model_dir):
    """Served with the shim preloaded (the suite's other nodes run without it): the
    worker process has it mapped, and greedy answers come back whole."""
    import httpx

    from nodes import NodeProcess, home_with, worker_pids

    home = home_with(tmp_path, tiny_model_dir)
    node = NodeProcess(home, "tiny-llama", env={"SHOAL_GEMV": "1"}).wait_healthy()
    try:
        node.wait_ready()
        body = {"model": "tiny-llama", "max_tokens": 12, "temperature": 0,
                "messages": [{"role": "user", "content": "hello"}]}
        answers = [httpx.post(node.url + "/v1/chat/completions", json=body, timeout=120)
                   for _ in range(2)]
        assert all(r.status_code == 200 for r in answers), answers[-1].text
        assert answers[0].json()["usage"]["completion_tokens"] == 12
        assert answers[0].json()["choices"][0]["message"] == \
            answers[1].json()["choices"][0]["message"]  # same shape alone: same answer
        pids = worker_pids(node)
        assert pids and all(gemv.shim() in _maps(pid) for pid in pids)
    finally:
        node.stop()


def _maps(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/maps").read()
    except OSError:
        return ""


@needs_build
def test_switched_off_the_worker_has_openblas_alone(monkeypatch):
    env = cpu.worker_env({"PATH": os.environ["PATH"], "SHOAL_GEMV": "0"})
    assert env["LD_PRELOAD"] == cpu.system_openblas()


def test_built_once_into_a_private_folder(tmp_path):
    if not (gemv.shutil.which("cc") or gemv.shutil.which("gcc")):
        pytest.skip("no C compiler")
    folder = tmp_path / "blas"
    path = gemv._build(folder)
    assert path and path.startswith(str(folder))
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    built = os.stat(path).st_mtime_ns
    assert gemv._build(folder) == path and os.stat(path).st_mtime_ns == built
    assert [p.name for p in folder.iterdir()] == [os.path.basename(path)]  # no leftovers


def test_a_folder_others_can_write_is_not_used(tmp_path, caplog):
    folder = tmp_path / "blas"
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    assert gemv._build(folder) is None
    assert "not private" in caplog.text
    assert not list(folder.iterdir())


def test_a_library_others_can_write_or_a_link_is_not_preloaded(tmp_path):
    folder = tmp_path / "blas"
    folder.mkdir(mode=0o700)
    name = f"gemv-{gemv.hashlib.sha256(gemv.SOURCE.read_bytes()).hexdigest()[:16]}.so"
    planted = folder / name
    planted.write_bytes(b"not a library")
    planted.chmod(0o666)
    assert gemv._build(folder) is None
    planted.unlink()
    (tmp_path / "elsewhere.so").write_bytes(b"x")
    planted.symlink_to(tmp_path / "elsewhere.so")
    assert gemv._build(folder) is None


def test_without_a_compiler_workers_start_without_it(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=gemv.__name__)
    monkeypatch.setattr(gemv.shutil, "which", lambda name: None)
    assert gemv._build(tmp_path / "blas") is None
    assert "no C compiler" in caplog.text
