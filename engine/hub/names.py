"""The one rule for names that come from outside and become paths on this disk: file paths,
revisions, commits and etags from the Hub or a neighbour, repo ids and model ids from
clients. Both sides use it: a pull refuses a whole file plan before writing anything
(check_plan), a node serving its cache skips or refuses what breaks it, and the cache's
path helpers (engine.hub.hfcache) check again after joining.

The shapes are huggingface_hub's own: a commit is 40 hex digits (REGEX_COMMIT_HASH), a
blob is named by the file's sha256 (LFS) or git blob sha1 (_normalize_etag strips the
HTTP quotes), a repo id is owner/name of at most 96 characters each (validate_repo_id).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from engine.errors import BadRequest
from engine.hub.errors import UnsafeName

if TYPE_CHECKING:
    from engine.hub.hfcache import Plan

MAX_PATH_CHARS = 1000
MAX_SEGMENT_BYTES = 200  # under NAME_MAX (255) with room for ".<name>.<id>.tmp"
MAX_DEPTH = 32
MAX_REVISION_CHARS = 200
MAX_REPO_ID_CHARS = 200  # owner and name are 96 at most each
MAX_MODEL_ID_BYTES = 200  # "models--" + this still fits one folder name
MAX_FILES = 100_000  # in one plan: no model repository comes near it

COMMIT = re.compile(r"[0-9a-f]{40}")
ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
ETAG_RULE = "an etag is a sha256 (64 hexadecimal digits) or a git sha1 (40)"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"[A-Za-z]:")
_REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
_NOT_IN_REF = re.compile(r"[ ~^:?*\[]|@\{")


def shown(name: object, limit: int = 80) -> str:
    """A name for a message: quoted, control characters escaped, a long one cut short."""
    if not isinstance(name, str):
        return f"<{type(name).__name__}>"
    if len(name) <= limit:
        return repr(name)
    return f"{name[:limit]!r}… ({len(name)} characters)"


def _common_problem(name: object, max_chars: int) -> str | None:
    if not isinstance(name, str):
        return "it is not a string"
    if not name:
        return "it is empty"
    if len(name) > max_chars:
        return f"it is {len(name)} characters long (at most {max_chars})"
    if _CONTROL.search(name):
        return "it holds a control character"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid Unicode"
    if "\\" in name:
        return "it holds a backslash"
    if name.startswith("/"):
        return "it is an absolute path"
    if _DRIVE.match(name):
        return "it starts with a drive (like C:)"
    return None


def path_problem(name: object) -> str | None:
    """Why `name` is no safe relative file path inside a folder, or None when it is one:
    no '..', '.' or empty segment, nothing absolute, no drive, backslash or control
    character, and short enough for every file system."""
    why = _common_problem(name, MAX_PATH_CHARS)
    if why or not isinstance(name, str):
        return why
    segments = name.split("/")
    if len(segments) > MAX_DEPTH:
        return f"it is {len(segments)} folders deep (at most {MAX_DEPTH})"
    for s in segments:
        if s == "":
            return "it has an empty segment ('//' or a '/' at the end)"
        if s in (".", ".."):
            return f"it has a '{s}' segment"
        if len(s.encode("utf-8")) > MAX_SEGMENT_BYTES:
            return f"a segment of it is longer than {MAX_SEGMENT_BYTES} bytes"
    return None


def revision_problem(name: object) -> str | None:
    """Why `name` is neither a 40-hex commit nor a branch or tag name git would accept
    (what becomes refs/<name> in the cache), or None."""
    if isinstance(name, str) and COMMIT.fullmatch(name):
        return None
    why = _common_problem(name, MAX_REVISION_CHARS) or path_problem(name)
    if why or not isinstance(name, str):
        return why
    if _NOT_IN_REF.search(name):
        return "it holds a character git doesn't allow in a branch name (space ~ ^ : ? * [ @{)"
    if any(s.startswith(".") or s.endswith(".lock") for s in name.split("/")) \
            or name.endswith(".") or name == "@":
        return "it is not a branch or tag name git would accept"
    return None


def commit_problem(name: object) -> str | None:
    """Why `name` is not a commit hash (40 lowercase hex digits), or None."""
    if isinstance(name, str) and COMMIT.fullmatch(name):
        return None
    return "a commit is 40 hexadecimal digits"


def normalize_etag(value: str) -> str:
    """An HTTP ETag as a blob name: without W/ and quotes (huggingface_hub's rule)."""
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"')


def etag_problem(name: object) -> str | None:
    """Why `name` (normalized) is not a file hash the Hub names blobs by: sha256 (64 hex)
    for LFS files, the git blob sha1 (40 hex) for others. None when it is one."""
    if isinstance(name, str) and ETAG.fullmatch(normalize_etag(name)):
        return None
    return ETAG_RULE


def repo_id_problem(name: object) -> str | None:
    """Why `name` is not a Hugging Face repo id (owner/name, letters, digits, '_', '-'
    and '.', at most 96 each, no '--' or '..'), or None."""
    why = _common_problem(name, MAX_REPO_ID_CHARS)
    if why or not isinstance(name, str):
        return why
    parts = name.split("/")
    if len(parts) != 2:
        return "it is not owner/name"
    if not all(_REPO_PART.fullmatch(p) for p in parts):
        return ("each part may hold letters, digits, '_', '-' and '.' (at most 96, "
                "starting and ending with a letter or digit)")
    if "--" in name or ".." in name or name.endswith(".git"):
        return "it holds '--' or '..', or ends in .git"
    return None


def bad_repo_id(repo_id: str, why: str | None = None) -> BadRequest:
    """The 400 for a repo id a user gave that is not one (param "repo")."""
    return BadRequest(f"{shown(repo_id)} is not a Hugging Face model id"
                      + (f": {why}" if why else "") + ". Write it as owner/name, for "
                      "example mlx-community/Llama-3.2-1B-Instruct-4bit.", param="repo")


def model_id_problem(name: object) -> str | None:
    """Why `name` can't be a model on this node (a folder in the models folder, or an
    owner/name in the Hugging Face cache), or None. Only the shape: whether it exists is
    the caller's question."""
    why = _common_problem(name, MAX_MODEL_ID_BYTES)
    if why or not isinstance(name, str):
        return why
    if len(name.encode("utf-8")) > MAX_MODEL_ID_BYTES:
        return f"it is longer than {MAX_MODEL_ID_BYTES} bytes"
    parts = name.split("/")
    if len(parts) > 2:
        return "it has more than one '/'"
    if any(p == "" or p.startswith(".") for p in parts):
        return "a part of it is empty or starts with '.'"
    return None


def check_plan(plan: Plan, source: str, advice: str = "") -> Plan:
    """`plan` with its etags as blob names, or UnsafeName naming `source` and the first
    name in it that breaks the rule; checked whole, before a byte is written."""
    def refuse(what: str, why: str) -> UnsafeName:
        return UnsafeName(f"{source[:1].upper()}{source[1:]} listed {what} for "
                          f"{shown(plan.repo_id)}, which Shoal "
                          f"refuses: {why}. Nothing was written."
                          + (f" {advice}" if advice else ""))

    for what, name, why in (("repository", plan.repo_id, repo_id_problem(plan.repo_id)),
                            ("revision", plan.revision, revision_problem(plan.revision)),
                            ("commit", plan.commit, commit_problem(plan.commit))):
        if why:
            raise refuse(f"the {what} {shown(name)}", why)
    if len(plan.files) > MAX_FILES:
        raise refuse(f"{len(plan.files)} files", f"a model has at most {MAX_FILES}")
    files = []
    folders: set[str] = set()
    seen: set[str] = set()
    for f in plan.files:
        why = path_problem(f.path)
        if why:
            raise refuse(f"the file path {shown(f.path)}", why)
        why = etag_problem(f.etag)
        if why:
            raise refuse(f"the etag {shown(f.etag)} (of {shown(f.path)})", why)
        if type(f.size) is not int or f.size < 0:
            raise refuse(f"the size {shown(str(f.size))} (of {shown(f.path)})",
                         "a size is a count of bytes")
        if f.path in seen:
            raise refuse(f"the file path {shown(f.path)} twice", "a path names one file")
        seen.add(f.path)
        parts = f.path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
        files.append(replace(f, etag=normalize_etag(f.etag)))
    clash = sorted(seen & folders)
    if clash:
        raise refuse(f"the file path {shown(clash[0])}", "it is both a file and a folder")
    return replace(plan, files=tuple(files))
