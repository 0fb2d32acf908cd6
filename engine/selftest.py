"""`shoal --self-test`: the checks that tell a packaged Shoal works on this machine. Each
step reports as it ends; a failed step names what broke and the rest are skipped."""

from __future__ import annotations

import argparse
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


def _evaluate(state: State) -> str:
    mx = state.mx
    a = mx.arange(1, 5, dtype=mx.float32)
    total = (a * a).sum()
    mx.eval(total)  # on Metal this is where a missing mlx.metallib shows
    if float(total.item()) != 30.0:
        raise RuntimeError(f"1²+2²+3²+4² came out as {total.item()}, not 30")
    return f"1²+2²+3²+4² = 30 on {mx.default_device()}"


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
        text += " (mlx.metallib must sit in mlx/lib beside libmlx; rebuild with packaging/build)"
    return text


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
