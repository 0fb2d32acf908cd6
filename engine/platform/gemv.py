"""Products of a few rows on the CPU through cblas_sgemv (gemv_shim.c).

A decode step of one sequence multiplies a single row by every weight matrix. OpenBLAS's
gemm packs the whole matrix before such a product; its gemv reads each weight once, and a
step of float32 SmolLM2 here takes about 60% of the time (docs/benchmarks.md: 46.7
against 73.8 ms). Up to four rows go row by row where the matrix fits in half the
last-level cache. The shim is built from its C source with the machine's C compiler once,
into the user's cache folder, and preloaded into workers in front of OpenBLAS. Without a
compiler, workers run without it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("gemv_shim.c")
BUILD_SECONDS = 60

_built: dict[str, str | None] = {}  # "path" -> the library, or None: not to be had


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The size of the CPU's last data (or unified) cache, as Linux reports it; 0 unknown."""
    best = (0, 0)
    for index in root.glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
            scale = {"K": 1024, "M": 1024 ** 2}.get(size[-1:], 1)
            best = max(best, (level, int(size.rstrip("KM")) * scale))
        except (OSError, ValueError):
            continue
    return best[1]


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shoal" / "blas"


def shim() -> str | None:
    """The built library's path, built at the first call of this process (a fraction of a
    second; later processes find it built); None, logged once, where it can't be."""
    if "path" not in _built:
        _built["path"] = _build(cache_folder())
    return _built["path"]


def private(path: Path) -> bool:
    """Owned by this user and writable by no one else: a library preloaded into every
    worker must not be one another account could have put there."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return (st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode)
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _build(folder: Path) -> str | None:
    try:
        source = SOURCE.read_bytes()
    except OSError as e:
        log.info("one-row products use OpenBLAS's gemm: no shim source (%s)", e)
        return None
    out = folder / f"gemv-{hashlib.sha256(source).hexdigest()[:16]}.so"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        log.info("one-row products use OpenBLAS's gemm: can't make %s (%s)", folder, e)
        return None
    if not private(folder):
        log.warning("one-row products use OpenBLAS's gemm: %s is not private to this user "
                    "(another account could write there); remove it to have it made again",
                    folder)
        return None
    if out.exists():
        if private(out):
            return str(out)
        log.warning("one-row products use OpenBLAS's gemm: %s is writable by others", out)
        return None
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("one-row products use OpenBLAS's gemm (slower): no C compiler to build "
                 "%s (install gcc)", SOURCE.name)
        return None
    tmp = folder / f".{out.name}.{os.getpid()}"
    try:
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE),
                               "-ldl"], capture_output=True, text=True,
                              timeout=BUILD_SECONDS)
        if done.returncode != 0:
            log.warning("one-row products use OpenBLAS's gemm: building %s failed: %s",
                        SOURCE.name, done.stderr.strip()[-500:])
            return None
        tmp.chmod(0o700)
        os.replace(tmp, out)  # whole or not at all, for a worker started meanwhile
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("one-row products use OpenBLAS's gemm: building %s failed: %s",
                    SOURCE.name, e)
        return None
    finally:
        tmp.unlink(missing_ok=True)
    log.info("built %s for one-row products", out)
    return str(out)
