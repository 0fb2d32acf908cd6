"""`shoal --self-test` on a machine where MLX can't load its GPU kernels: the failing step
is named with what to do, the rest are skipped, and the exit code says it failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import selftest


def test_a_failed_step_is_named_and_the_rest_skipped(tmp_path: Path, capsys,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def no_metallib(state: selftest.State) -> str:
        raise RuntimeError("Failed to load the default metallib. library not found")

    steps = [(name, no_metallib if name.startswith("evaluate") else fn)
             for name, fn in selftest.STEPS]
    monkeypatch.setattr(selftest, "STEPS", steps)
    assert selftest.main(["--home", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("[ok  ] import MLX: MLX ")
    assert out[2].startswith("[FAIL] evaluate on the default device: RuntimeError: Failed to "
                             "load the default metallib")
    assert "mlx.metallib must sit in mlx/lib beside libmlx" in out[2]
    assert out[3].startswith("[skip] load the default model")
    assert out[4].startswith("[skip] generate a token")
    assert out[-1] == "self-test FAILED"
    assert not (tmp_path / "models").exists()  # nothing imported after the failure
