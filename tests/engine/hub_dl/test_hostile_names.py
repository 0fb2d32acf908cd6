"""A hostile Hub (tests/hubserver.py at HF_ENDPOINT, turned hostile with `plant` and
`listed_sha`) lists file paths, etags and a commit that would lead out of the Hugging Face
cache: ../ walks, absolute and drive paths, backslashes. ".py" names match the default
patterns, so before names were checked such a file was fetched, passed its hash check (the
listing chose the etag) and was linked wherever the name pointed, e.g. as a virtualenv's
sitecustomize.py (the class of Ollama's CVE-2024-37032). Now the pull fails naming the Hub
and the name, and nothing is written: no file outside the cache, no blob, link or ref in
it. The real huggingface_hub client does every request."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hub_models import SHARDED

from engine.errors import BadRequest
from engine.hub.download import pull
from engine.hub.errors import UnsafeName
from engine.hub.names import shown


def _everything(root: Path) -> set[str]:
    """Every file, folder and link under root (links not followed)."""
    found = set()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(folder, name), root))
    return found


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    p = tmp_path / "payload" / "evil.py"
    p.parent.mkdir()
    p.write_text("import os; os.system('echo pwned')\n")
    return p


def _outside(tmp_path: Path) -> str:
    return str(tmp_path / "site-packages" / "sitecustomize.py")  # absolute


HOSTILE_PATHS = {
    "dot-dot": "../../../../site-packages/sitecustomize.py",
    "absolute": None,  # _outside(tmp_path): known only inside the test
    "backslash": "a\\..\\..\\sitecustomize.py",
    "drive": "C:/Users/me/sitecustomize.py",
    "empty segment": "tools//sitecustomize.py",
    "control character": "tools/sitecustomize\n.py",
}


@pytest.mark.parametrize("kind", list(HOSTILE_PATHS))
def test_a_file_path_that_leaves_the_snapshot_fails_the_pull_and_writes_nothing(
        hub, hf_env: Path, tmp_path: Path, payload: Path, kind: str) -> None:
    path = HOSTILE_PATHS[kind] or _outside(tmp_path)
    hub.plant(SHARDED, path, payload)
    before = _everything(tmp_path)
    with pytest.raises(UnsafeName) as e:
        pull(SHARDED)
    assert e.value.message.startswith(f"The Hub ({hub.url}) listed the file path "
                                      f"{shown(path)} for 'test-org/tiny-sharded'")
    assert "Nothing was written" in e.value.message
    assert _everything(tmp_path) == before
    assert hub.served() == 0


@pytest.mark.parametrize("etag", ["../../x", "../../../../sitecustomize.py",
                                  "/tmp/x", "0" * 63, "not-a-hash"])
def test_an_etag_that_is_not_a_hash_fails_the_pull_and_writes_nothing(
        hub, hf_env: Path, tmp_path: Path, payload: Path, etag: str) -> None:
    """The etag names the blob, so "../../x" was a file written outside blobs/, and a
    non-hash etag was checked by size only."""
    hub.plant(SHARDED, "extra.py", payload, etag=etag)
    before = _everything(tmp_path)
    with pytest.raises(UnsafeName) as e:
        pull(SHARDED)
    assert "The Hub" in e.value.message and etag in e.value.message
    assert "extra.py" in e.value.message
    assert _everything(tmp_path) == before


@pytest.mark.parametrize("sha", ["../main", "../../../../x", "main", "A" * 40, "g" * 40])
def test_a_commit_that_is_not_40_hex_fails_the_pull_and_writes_nothing(
        hub, hf_env: Path, tmp_path: Path, sha: str) -> None:
    """The commit names the snapshot folder: "../main" put the model's links in
    models--x/main/ and refs/main pointed at it."""
    hub.repos[SHARDED].listed_sha = sha
    before = _everything(tmp_path)
    with pytest.raises(UnsafeName) as e:
        pull(SHARDED)
    assert f"The Hub ({hub.url}) listed the commit {sha!r}" in e.value.message
    assert _everything(tmp_path) == before


@pytest.mark.parametrize("revision", ["../main", "/main", "main\\..", "a b", "x" * 300])
def test_a_revision_asked_for_is_checked_before_the_hub_is_asked(
        hub, hf_env: Path, tmp_path: Path, revision: str) -> None:
    before = _everything(tmp_path)
    with pytest.raises(BadRequest) as e:
        pull(SHARDED, revision=revision)
    assert e.value.param == "revision" and len(e.value.message) < 400
    assert _everything(tmp_path) == before


@pytest.mark.parametrize("repo", ["../etc", "a/../../b", "a/b/c", "/abs/x", "a\\b",
                                  "a--b/c", "a/b\x00", "o/" + "n" * 100_000])
def test_a_repo_id_is_checked_before_the_hub_is_asked(hub, hf_env: Path, tmp_path: Path,
                                                       repo: str) -> None:
    before = _everything(tmp_path)
    with pytest.raises(BadRequest) as e:
        pull(repo)
    assert e.value.param == "repo" and len(e.value.message) < 400
    assert _everything(tmp_path) == before


def test_the_same_hub_once_honest_again_is_pulled_as_usual(hub, hf_env: Path,
                                                            payload: Path) -> None:
    """The refusals above leave nothing that stands in the way of the next pull."""
    hub.plant(SHARDED, "../x.py", payload)
    with pytest.raises(UnsafeName):
        pull(SHARDED)
    del hub.repos[SHARDED].files["../x.py"]
    snap = pull(SHARDED)
    assert {p.name for p in snap.iterdir()} == set(hub.repos[SHARDED].files)
