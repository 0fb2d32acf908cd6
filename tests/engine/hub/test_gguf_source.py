"""Which GGUF file llama.cpp may serve for a model folder (engine/hub/gguf_source.py): the
import's own link inside the folder, or Shoal's bundled file. A downloaded folder can't
point it anywhere else: a config.json naming another path, a `source.gguf` that isn't a
GGUF (a link to a system file, say) and a source named like the bundled one that isn't
Shoal's are all refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.hub.gguf_source import NAME, gguf_source, keep_source, model_files


def folder_with(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_only_a_gguf_inside_the_folder_or_shoals_own_is_served(tmp_path: Path) -> None:
    elsewhere = tmp_path / "other.gguf"
    elsewhere.write_bytes(b"GGUF" + b"\0" * 60)
    folder = folder_with(tmp_path, {"shoal_import": {
        "source": "other.gguf", "source_path": str(elsewhere), "source_bytes": 64}})
    assert gguf_source(folder) is None  # a path in config.json names nothing it reads
    assert gguf_source(folder, bundled=elsewhere) == elsewhere  # Shoal's own, by name

    os.symlink("/etc/passwd", folder / NAME)  # a hostile download's "source.gguf"
    assert gguf_source(folder) is None
    (folder / NAME).unlink()
    (folder / NAME).write_bytes(b"not a gguf")
    assert gguf_source(folder) is None

    (folder / NAME).unlink()
    keep_source(elsewhere, folder)  # what an import does: a link, not a copy
    assert gguf_source(folder) == folder / NAME
    assert (folder / NAME).stat().st_ino == elsewhere.stat().st_ino
    assert [p.name for p in model_files(folder)] == ["config.json"]  # counted once
