"""`shoal --self-test`: a real matmul on MLX's default device checked against numpy (here
the CPU; on a Mac it must be the GPU), and on a machine where MLX can't load its GPU
kernels, the failing step named with what to do, the rest skipped, and exit code 1."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import selftest

FIRST_TWO = selftest.STEPS[:2]  # import MLX, evaluate: the model steps have tests of their own


class BrokenMetal:
    """mlx.core as it behaves on a Mac whose bundle lacks mlx.metallib: the first kernel
    fails (the message is MLX 0.32's own); everything else is the real module."""

    def __init__(self, mx: Any) -> None:
        self._mx = mx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mx, name)

    def eval(self, *arrays: Any) -> None:
        raise RuntimeError("Failed to load the default metallib. library not found library "
                           "not found library not found library not found ")


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path,
        steps: list) -> tuple[int, list[str]]:
    monkeypatch.setattr(selftest, "STEPS", steps)
    code = selftest.main(["--home", str(home)])
    return code, capsys.readouterr().out.splitlines()


def test_a_real_matmul_on_the_default_device_matches_numpy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = run(monkeypatch, capsys, tmp_path, FIRST_TWO)
    assert out[1].startswith("[ok  ] import MLX: MLX 0.")
    assert out[2].startswith("[ok  ] evaluate on the default device: 64x32 by 32x48 matmul "
                             "on Device(cpu, 0) matches numpy (largest difference ")
    assert (out[-1], code) == ("self-test passed", 0)


def test_a_missing_metallib_fails_loudly_and_says_where_it_looked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def import_broken(state: selftest.State) -> str:
        detail = selftest._import_mlx(state)
        state.mx = BrokenMetal(state.mx)
        return detail

    steps = [("import MLX", import_broken), *selftest.STEPS[1:]]
    code, out = run(monkeypatch, capsys, tmp_path, steps)
    assert out[1].startswith("[ok  ] import MLX: MLX ")
    assert out[2].startswith("[FAIL] evaluate on the default device: RuntimeError: Failed to "
                             "load the default metallib. library not found")
    import mlx
    beside = Path(mlx.__path__[0]) / "lib" / "mlx.metallib"
    assert f"beside the libmlx it loaded: {beside} is missing" in out[2]  # Linux wheels: none
    assert "rebuild with packaging/build" in out[2]
    assert out[3].startswith("[skip] load the default model")
    assert out[4].startswith("[skip] generate a token")
    assert (out[-1], code) == ("self-test FAILED", 1)
    assert not (tmp_path / "models").exists()  # nothing imported after the failure


def test_in_the_app_it_names_the_top_level_folder_too(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mlx.metallib").write_bytes(b"MTLB")
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    hint = selftest._hint(RuntimeError("Failed to load the default metallib. "))
    assert f"{tmp_path / 'mlx.metallib'} is there, " in hint
    assert "mlx/lib/mlx.metallib is missing" in hint


def test_on_a_mac_the_cpu_is_not_good_enough(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    code, out = run(monkeypatch, capsys, tmp_path, FIRST_TWO)
    assert out[2].startswith("[FAIL] evaluate on the default device: RuntimeError: MLX's "
                             "default device is Device(cpu, 0), not this Mac's GPU "
                             "(Metal available: False)")
    assert code == 1


def test_a_wrong_product_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    class OffByOne(BrokenMetal):
        def eval(self, *arrays: Any) -> None:
            self._mx.eval(*arrays)

        def matmul(self, a: Any, b: Any) -> Any:
            return self._mx.matmul(a, b) + 1

    def import_off(state: selftest.State) -> str:
        detail = selftest._import_mlx(state)
        state.mx = OffByOne(state.mx)
        return detail

    code, out = run(monkeypatch, capsys, tmp_path, [("import MLX", import_off), FIRST_TWO[1]])
    assert out[2].startswith("[FAIL] evaluate on the default device: RuntimeError: a 64x32 by "
                             "32x48 matmul on Device(cpu, 0) is off numpy's by up to 1")
    assert code == 1
