"""`shoal --self-test`: the checks that tell a packaged Shoal works on this machine. Each
step reports as it ends; a failed step names what broke and the rest are skipped."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.paths import default_home, models_dir


@dataclass(frozen=True)
class Step:
    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class State:
    """What the steps hand on, each filling in what a later one uses (mlx objects are Any:
    mlx is imported inside the steps, and is absent where this is type-checked)."""
    home: Path
    mx: Any = None  # mlx.core, once imported
    model: Any = None
    tokenizer: Any = None


def _import_mlx(state: State) -> str:
    import mlx
    import mlx.core as mx
    state.mx = mx
    return f"MLX {getattr(mx, '__version__', '?')} from {Path(mlx.__path__[0])}"


def _gpu_expected() -> bool:
    """Apple silicon: MLX must run on the GPU (a CPU fallback would be a broken bundle)."""
    return sys.platform == "darwin" and platform.machine() == "arm64"


def _evaluate(state: State) -> str:
    import numpy as np
    mx = state.mx
    device = mx.default_device()
    if _gpu_expected() and device.type != mx.gpu:
        raise RuntimeError(f"MLX's default device is {device}, not this Mac's GPU "
                           f"(Metal available: {mx.metal.is_available()})")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 32), dtype=np.float32)
    b = rng.standard_normal((32, 48), dtype=np.float32)
    product = mx.matmul(mx.array(a), mx.array(b))
    mx.eval(product)  # on Metal the first kernel loads mlx.metallib: a missing one fails here
    got, want = np.array(product), a @ b
    off = float(np.abs(got - want).max())
    if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
        raise RuntimeError(f"a 64x32 by 32x48 matmul on {device} is off numpy's by up to {off:.3g}")
    return f"64x32 by 32x48 matmul on {device} matches numpy (largest difference {off:.1g})"


def _load(state: State) -> str:
    from engine.hub.bundled import ensure_default_model
    from engine.runtime.load import load_model
    folder = ensure_default_model(models_dir(state.home))
    state.model, state.tokenizer, _ = load_model(folder)
    return f"{folder.name} from {folder}"


def _generate(state: State) -> str:
    from engine.runtime.generate import build_prompt, generate
    from engine.runtime.sampling import Sampling
    prompt = build_prompt(state.tokenizer, [{"role": "user", "content": "Say hello."}])
    records = list(generate(state.model, state.tokenizer, prompt,
                            Sampling(max_tokens=1)))
    text = "".join(r.text for r in records)
    if not records or records[-1].generation_tokens < 1:
        raise RuntimeError("the model produced no token")
    return f"first token {text!r} after a {len(prompt)}-token prompt"


STEPS: list[tuple[str, Callable[[State], str]]] = [
    ("import MLX", _import_mlx),
    ("evaluate on the default device", _evaluate),
    ("load the default model", _load),
    ("generate a token", _generate),
]


def _hint(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    if error.__cause__ is not None:  # MLX's extension hides the real reason here
        text += f" ({type(error.__cause__).__name__}: {error.__cause__})"
    if "metallib" in text:
        text += (" (MLX looks for mlx.metallib beside the libmlx it loaded: "
                 f"{_metallib_places()}; rebuild with packaging/build)")
    return text


def _metallib_places() -> str:
    """Where mlx.metallib is and isn't: mlx/lib, and in the app the top-level folder, where
    PyInstaller links libmlx too."""
    import mlx
    folders = [Path(mlx.__path__[0]) / "lib"]
    top = getattr(sys, "_MEIPASS", None)
    if top is not None:
        folders.insert(0, Path(top))
    files = [f / "mlx.metallib" for f in folders]
    return ", ".join(f"{f} {'is there' if f.is_file() else 'is missing'}" for f in files)


def run(home: Path) -> Iterator[Step]:
    """Run the steps in order; after a failure the rest are reported as skipped."""
    state = State(home)
    failed = False
    for name, step in STEPS:
        if failed:
            yield Step(name, False, "skipped", 0.0)
            continue
        t0 = time.perf_counter()
        try:
            detail, ok = step(state), True
        except Exception as e:  # every failure is a finding to report, not a crash
            detail, ok, failed = _hint(e), False, True
        yield Step(name, ok, detail, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="shoal --self-test",
                                description="Check that MLX and the default model work here.")
    p.add_argument("--home", type=Path, default=None, help="state folder (default: per user)")
    args, _ = p.parse_known_args(argv)
    home = args.home or default_home()
    print(f"Shoal self-test ({'frozen app' if getattr(sys, 'frozen', False) else sys.executable})",
          flush=True)
    ok = True
    for s in run(home):
        ok = ok and s.ok
        mark = "ok  " if s.ok else ("skip" if s.detail == "skipped" else "FAIL")
        print(f"[{mark}] {s.name}: {s.detail} ({s.seconds:.1f} s)", flush=True)
    print("self-test passed" if ok else "self-test FAILED", flush=True)
    return 0 if ok else 1
