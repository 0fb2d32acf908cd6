"""engine.hub.names, rule by rule: which names from outside may become paths on this disk
(file paths, revisions, commits, etags, repo ids, model ids), and check_plan refusing a
file plan as a whole with a message that names its source and the name."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.hub import names
from engine.hub.errors import UnsafeName
from engine.hub.hfcache import (
    Plan,
    RemoteFile,
    blob_path,
    inside,
    link_snapshot,
    pointer_path,
    read_ref,
    ref_path,
    write_ref,
)

SHA1 = "a" * 40
SHA256 = "b" * 64


@pytest.mark.parametrize("path", [
    "config.json", "model-00001-of-00002.safetensors", ".gitattributes", "a/b/c.json",
    "with space.txt", "ünïcödé.json", "ab:c.json", "x" * 200, "/".join(["d"] * 32)])
def test_file_paths_the_hub_uses_pass(path: str) -> None:
    assert names.path_problem(path) is None


@pytest.mark.parametrize("path,why", [
    ("", "empty"), ("../x", "'..' segment"), ("a/../../x", "'..' segment"),
    ("a/./b", "'.' segment"), ("/etc/passwd", "absolute"), ("C:/x", "drive"),
    ("c:x", "drive"), ("a:b.json", "drive"), ("a\\b", "backslash"), ("..\\x", "backslash"),
    ("a\x00b", "control"), ("a\nb", "control"), ("a\x7fb", "control"),
    ("a//b", "empty segment"), ("a/", "empty segment"), ("x" * 201, "200 bytes"),
    ("é" * 101, "200 bytes"), ("x" * 1001, "characters long"),
    ("/".join(["d"] * 33), "folders deep"), ("\ud800", "Unicode"), (None, "not a string"),
    (7, "not a string")])
def test_file_paths_that_could_leave_their_folder_are_refused(path: object, why: str
                                                              ) -> None:
    assert why in (names.path_problem(path) or "")


@pytest.mark.parametrize("rev", ["main", "v1.0", "refs/pr/1", "release/2024-01", SHA1])
def test_branch_tag_and_commit_names_pass(rev: str) -> None:
    assert names.revision_problem(rev) is None


@pytest.mark.parametrize("rev", ["", "../main", "/main", "main/..", "a b", "a~1", "a^",
                                 "a:b", "a?", "a*", "a[", "a@{1}", ".hidden", "x.lock",
                                 "x.", "@", "C:/x", "a\\b", "a\x00", "x" * 201])
def test_other_revisions_are_refused(rev: str) -> None:
    assert names.revision_problem(rev)


def test_a_commit_is_40_lowercase_hex() -> None:
    assert names.commit_problem(SHA1) is None
    for bad in ("A" * 40, "a" * 39, "a" * 41, "g" * 40, "../main", "main", ""):
        assert names.commit_problem(bad)


def test_an_etag_is_a_sha256_or_a_git_sha1_quoted_or_not() -> None:
    for ok in (SHA1, SHA256, f'"{SHA256}"', f'W/"{SHA1}"'):
        assert names.etag_problem(ok) is None
    assert names.normalize_etag(f'W/"{SHA1}"') == SHA1
    for bad in ("", "e", "../../x", "/tmp/x", "0" * 63, "A" * 64, SHA1 + "/x",
                f"{SHA1}\n", "W/" + SHA1[:-1]):
        assert names.etag_problem(bad) == names.ETAG_RULE


def test_repo_ids_are_owner_slash_name_as_the_hub_allows() -> None:
    for ok in ("mlx-community/Llama-3.2-1B-Instruct-4bit", "a/b", "o_1/n.x"):
        assert names.repo_id_problem(ok) is None
    for bad in ("", "name", "a/b/c", "../etc", "a/..", "a--b/c", "a/b.git", "-a/b",
                "a/b-", ".a/b", "a b/c", "a/b\x00", "o/" + "n" * 97, "/a/b", "a\\b"):
        assert names.repo_id_problem(bad), bad


def test_model_ids_are_a_folder_or_owner_slash_name_and_short() -> None:
    for ok in ("tiny-llama", "SmolLM2-135M-Instruct-Q4_1", "mlx-community/x", "llama3:8b",
               "My Model"):
        assert names.model_id_problem(ok) is None
    for bad in ("", "a" * 201, "é" * 101, "a/b/c", "../x", ".hidden", "a/.b", "a//",
                "/abs", "C:/x", "a\\b", "a\x00", "a\nb"):
        assert names.model_id_problem(bad), bad


def test_shown_names_are_short_and_escaped() -> None:
    assert names.shown("a\nb") == "'a\\nb'"
    long = names.shown("a" * 100_000)
    assert len(long) < 120 and "100000 characters" in long


def _plan(*files: RemoteFile, commit: str = SHA1) -> Plan:
    return Plan("o/n", "main", commit, files)


def test_a_plan_is_refused_whole_at_its_first_bad_name() -> None:
    good = RemoteFile("config.json", 3, SHA1)
    with pytest.raises(UnsafeName) as e:
        names.check_plan(_plan(good, RemoteFile("../x.py", 3, SHA256)), "the Hub (h)",
                         "Try later.")
    assert e.value.message == ("The Hub (h) listed the file path '../x.py' for 'o/n', "
                               "which Shoal refuses: it has a '..' segment. Nothing was "
                               "written. Try later.")
    for plan, shows in [
            (_plan(good, commit="../main"), "the commit '../main'"),
            (_plan(RemoteFile("x", 3, "../../x")), "the etag '../../x' (of 'x')"),
            (_plan(RemoteFile("x", -1, SHA1)), "the size '-1'"),
            (_plan(good, good), "'config.json' twice"),
            (_plan(RemoteFile("a", 1, SHA1), RemoteFile("a/b", 1, SHA1)),
             "the file path 'a'"),
            (_plan(*[RemoteFile(f"f{i}", 1, SHA1) for i in range(names.MAX_FILES + 1)]),
             f"{names.MAX_FILES + 1} files")]:
        with pytest.raises(UnsafeName, match="^Peer p") as e:
            names.check_plan(plan, "peer p")
        assert shows in e.value.message


def test_a_plan_that_passes_has_bare_etags() -> None:
    plan = names.check_plan(_plan(RemoteFile("config.json", 3, f'"{SHA1}"')), "the Hub")
    assert plan.files == (RemoteFile("config.json", 3, SHA1),)


# --- the cache's own path helpers: the last line of defence --------------------------------
def test_the_cache_path_helpers_refuse_what_leaves_their_folder(tmp_path: Path) -> None:
    repo = tmp_path / "models--o--n"
    (repo / "blobs").mkdir(parents=True)
    blob = repo / "blobs" / SHA1
    blob.write_text("x")
    for call in (lambda: pointer_path(repo, "../main", "x"),
                 lambda: pointer_path(repo, SHA1, "../../../x"),
                 lambda: blob_path(repo, "../x"), lambda: blob_path(repo, f'"{SHA1}"'),
                 lambda: ref_path(repo, "../x"),
                 lambda: inside(repo, "/etc/passwd"),
                 lambda: link_snapshot(repo, SHA1, "/tmp/x", blob),
                 lambda: link_snapshot(repo, "../x", "a", blob),
                 lambda: write_ref(repo, "../../x", SHA1),
                 lambda: write_ref(repo, "main", "../x")):
        with pytest.raises(UnsafeName):
            call()
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["blobs", SHA1, "models--o--n"])


def test_a_link_planted_inside_a_snapshot_is_not_followed_out(tmp_path: Path) -> None:
    repo = tmp_path / "models--o--n"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / SHA1).write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "snapshots" / SHA1).mkdir(parents=True)
    (repo / "snapshots" / SHA1 / "sub").symlink_to(outside)
    with pytest.raises(UnsafeName, match="leads out of its folder"):
        link_snapshot(repo, SHA1, "sub/sitecustomize.py", repo / "blobs" / SHA1)
    assert list(outside.iterdir()) == []


def test_a_ref_is_read_only_as_a_commit(tmp_path: Path) -> None:
    repo = tmp_path / "models--o--n"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SHA1 + "\n")
    (repo / "refs" / "evil").write_text("../../../etc")
    assert read_ref(repo, "main") == SHA1 and read_ref(repo, SHA1) == SHA1
    assert read_ref(repo, "evil") is None and read_ref(repo, "none") is None
    assert read_ref(repo, "../main") is None
