"""The Hugging Face cache layout (blobs/<etag>, snapshots/<commit>/<path> symlinks, refs/)
and the checks that a file is the one the Hub describes. Every path into a repository's
folder is made here, and checked here (engine.hub.names) after joining: the last line of
defence behind the checks of each plan."""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from engine.hub import names
from engine.hub.errors import UnsafeName
from engine.hub.names import bad_repo_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    etag: str  # sha256 of an LFS file, else its git blob sha1; also its blob's file name


@dataclass(frozen=True)
class Plan:
    """The files of one repo at one commit, as the Hub (or a neighbour) lists them."""
    repo_id: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]


def verify_file(path: Path, f: RemoteFile) -> bool:
    """True when path has f's size and the hash its etag names (sha256 or git sha1)."""
    size = path.stat().st_size
    if size != f.size:
        return False
    if len(f.etag) == 64:
        h = hashlib.sha256()
    elif len(f.etag) == 40:
        h = hashlib.sha1(b"blob %d\0" % size)
    else:
        log.warning("%s: etag %r is not a hash; checked its size only", f.path, f.etag)
        return True
    with open(path, "rb") as src:
        while chunk := src.read(1 << 20):
            h.update(chunk)
    return h.hexdigest() == f.etag


def verify_snapshot(snapshot: Path) -> list[str]:
    """The files of a cached snapshot whose content doesn't match their blob's name (the
    Hub's hash): what a loader should refuse and a pull will fetch again. No network."""
    bad = []
    for p in sorted(Path(snapshot).rglob("*")):
        blob = p.resolve()
        if p.is_symlink() and blob.is_file():
            rel = p.relative_to(snapshot).as_posix()
            if not verify_file(blob, RemoteFile(rel, blob.stat().st_size, blob.name)):
                bad.append(rel)
    return bad


def repo_dir(cache: Path, repo_id: str) -> Path:
    """models--<owner>--<name>; BadRequest for anything but a Hugging Face repo id."""
    why = names.repo_id_problem(repo_id)
    if why:
        raise bad_repo_id(repo_id, why)
    return Path(cache) / ("models--" + repo_id.replace("/", "--"))


def inside(folder: Path, rel: str) -> Path:
    """folder/rel, when rel is a safe relative path and the folder it lands in, with
    links resolved, is `folder` or below it; UnsafeName otherwise."""
    why = names.path_problem(rel)
    if why is None:
        base, parent = folder.resolve(), (folder / rel).parent.resolve()
        if parent != base and base not in parent.parents:
            why = "it leads out of its folder through a link"
    if why:
        raise UnsafeName(f"Refusing {names.shown(rel)} under {folder.name}/ in the "
                         f"Hugging Face cache: {why}.")
    return folder / rel


def pointer_path(repo: Path, commit: str, path: str) -> Path:
    """snapshots/<commit>/<path>, checked."""
    why = names.commit_problem(commit)
    if why:
        raise UnsafeName(f"Refusing the snapshot {names.shown(commit)}: {why}.")
    return inside(repo / "snapshots" / commit, path)


def blob_path(repo: Path, etag: str) -> Path:
    """blobs/<etag>, checked: an etag is a bare sha256 or git sha1."""
    if not names.ETAG.fullmatch(etag):
        raise UnsafeName(f"Refusing the blob {names.shown(etag)}: "
                         f"{names.ETAG_RULE}.")
    return inside(repo / "blobs", etag)


def ref_path(repo: Path, revision: str) -> Path:
    """refs/<revision>, checked."""
    why = names.revision_problem(revision)
    if why:
        raise UnsafeName(f"Refusing the revision {names.shown(revision)}: {why}.")
    return inside(repo / "refs", revision)


def read_ref(repo: Path, revision: str) -> str | None:
    """The commit refs/<revision> names (or revision itself, when it is a commit); None
    when there is no such ref or it holds no commit."""
    if names.COMMIT.fullmatch(revision):
        return revision
    try:
        with open(ref_path(repo, revision), encoding="ascii", errors="replace") as f:
            commit = f.read(64).strip()
    except (OSError, UnsafeName):
        return None
    return commit if names.COMMIT.fullmatch(commit) else None


def link_snapshot(repo: Path, commit: str, path: str, blob: Path) -> None:
    """snapshots/<commit>/<path> -> ../../blobs/<etag> (relative, as huggingface_hub)."""
    blob = blob_path(repo, blob.name)
    pointer = pointer_path(repo, commit, path)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    inside(repo / "snapshots" / commit, path)  # again, now that its folders exist
    target = os.path.relpath(blob, pointer.parent)
    if pointer.is_symlink() and os.readlink(pointer) == target:
        return
    tmp = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex[:8]}.tmp")
    os.symlink(target, tmp)
    os.replace(tmp, pointer)  # atomic: a reader sees the old link or the new one


def write_ref(repo: Path, revision: str, commit: str) -> None:
    if names.COMMIT.fullmatch(revision):
        return
    why = names.commit_problem(commit)
    if why:
        raise UnsafeName(f"Refusing to point {names.shown(revision)} at "
                         f"{names.shown(commit)}: {why}.")
    ref = ref_path(repo, revision)
    ref.parent.mkdir(parents=True, exist_ok=True)
    if ref.is_file() and ref.read_text() == commit:
        return
    tmp = ref.with_name(f"{ref.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def _adopt_partials(blob: Path, part: Path) -> None:
    """Reuse what a killed hf_hub_download left (blobs/<etag>.<id>.incomplete): under the
    blob's lock nobody else is writing it, and its bytes are a prefix of the blob."""
    best = part.stat().st_size if part.exists() else 0
    for p in blob.parent.glob(f"{blob.name}.*.incomplete"):
        if p.stat().st_size > best:
            os.replace(p, part)
            best = part.stat().st_size
        else:
            p.unlink(missing_ok=True)
