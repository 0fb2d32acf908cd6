"""How `shoal connect --write` changes a file of the user's: it sets only Shoal's own keys
and keeps the rest as it was (comments too) where the format allows; it keeps a dated
copy of what was there and never overwrites an older copy; it writes atomically and keeps
the file's permissions; and a file it can't read is left alone, with a message that says
what to do."""

from __future__ import annotations

import difflib
import io
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from engine.errors import ShoalError


class ConfigFileError(ShoalError):
    """An agent's config file that can't be read, parsed or written; left as it was."""


class Unparsable(ValueError):
    """Raised by an edit: the text isn't valid in its format (the message says where;
    engine.connect_jsonc's JsoncError is taken as one)."""


class Unexpected(Unparsable):
    """Raised by an edit: a setting Shoal would edit has a shape it can't take (a list
    where a table should be, ...), so it isn't replaced."""


@dataclass(frozen=True)
class Written:
    path: Path
    backup: Path | None  # the file as it was (None: there was none, or nothing changed)
    changed: bool


def update(path: Path, kind: str, edit: Callable[[str | None], str]) -> Written:
    """Change the file at `path` to edit(its text), or edit(None) where there is none.
    `kind` names the format in messages ("TOML", ...)."""
    real = path.resolve() if path.is_symlink() else path  # a dotfiles link stays a link
    try:
        data: bytes | None = real.read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as e:
        raise ConfigFileError(f"Could not read {path} ({e.strerror}); nothing was "
                              "changed.") from None
    from engine.connect_jsonc import JsoncError, NotAnObject
    leave = "it was left as it is: fix it, or move it aside and run this again."
    try:
        old = None if data is None else data.decode("utf-8")
        new = edit(old)
    except UnicodeDecodeError:
        raise ConfigFileError(f"{path} is not UTF-8 text; {leave}") from None
    except (Unexpected, NotAnObject) as e:
        raise ConfigFileError(f"{path}: {e}; {leave}") from None
    except (Unparsable, JsoncError) as e:
        raise ConfigFileError(f"{path} is not valid {kind} ({e}); {leave}") from None
    except ConfigFileError as e:
        raise ConfigFileError(f"{path}: {e.message}") from None
    if new == old:
        return Written(path, None, False)
    try:
        backup = None if data is None else _backup(path, real, data)
        _replace(real, new.encode("utf-8"))
    except OSError as e:
        raise ConfigFileError(f"Could not write {path} ({e.strerror or e}); it was left as "
                              "it was.") from None
    return Written(path, backup, True)


def _backup(path: Path, real: Path, data: bytes) -> Path:
    """A copy of `data` beside `path`, named for now; an existing copy is never replaced."""
    stamp = datetime.now().strftime("%Y-%m-%dT%H-%M-%S")
    mode = real.stat().st_mode & 0o777
    for n in range(1, 1000):
        name = f"{path.name}.{stamp}.bak" if n == 1 else f"{path.name}.{stamp}_{n}.bak"
        dest = path.with_name(name)
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return dest
    raise FileExistsError(f"999 backups of {path.name} this second")


def _replace(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename, so the file is never half written;
    the file keeps its permissions (and owner, for root); a new one is only the user's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, st.st_mode & 0o7777 if st else 0o600)
        if st and hasattr(os, "geteuid") and os.geteuid() == 0:
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# TOML (tomlkit keeps comments, layout and the order of everything it doesn't change)

def merge_toml(text: str, fresh: str, drop: Sequence[Sequence[str]] = ()) -> str:
    """`text` with every key of the TOML `fresh` set (into the tables already there) and
    the keys at `drop` removed."""
    import tomllib

    import tomlkit
    from tomlkit.exceptions import TOMLKitError
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as e:
        raise Unparsable(str(e)) from None
    _merge_table(doc, tomlkit.parse(fresh), [])
    for path in drop:
        table: Any = doc
        for key in path[:-1]:
            table = table.get(key) if hasattr(table, "get") else None
        if hasattr(table, "get") and path[-1] in table:
            del table[path[-1]]
    out = tomlkit.dumps(doc)
    if out.endswith("\n\n") and not text.endswith("\n\n"):
        out = out.rstrip("\n") + "\n"  # a new last table's blank line, see _merge_table
    tomllib.loads(out)  # what tomlkit wrote reads back
    return out


def _merge_table(dst: Any, src: Any, path: list[str]) -> None:
    import tomlkit
    from tomlkit.container import OutOfOrderTableProxy
    from tomlkit.items import InlineTable, Table
    tables = (Table, InlineTable, OutOfOrderTableProxy)
    for key, value in src.items():
        if not isinstance(value, tables):
            if key not in dst or dst[key] != value.unwrap():
                dst[key] = value.unwrap()
            continue
        if key not in dst:
            table = tomlkit.table(is_super_table=all(isinstance(v, Table)
                                                    for v in value.values()))
            _merge_table(table, value, [*path, key])
            if not table.is_super_table():
                table.add(tomlkit.nl())  # a blank line before the table that follows it
            dst[key] = table
        elif isinstance(dst[key], tables):
            _merge_table(dst[key], value, [*path, key])
        else:
            raise Unexpected(f"{'.'.join([*path, key])} is {dst[key].as_string().strip()}, "
                             "not a table")


# YAML (ruamel.yaml's round trip keeps comments, quotes and key order)

def merge_yaml_list(text: str, fresh: str, list_key: str, by: str) -> str:
    """`text` with the YAML `fresh` merged in: its top-level keys that `text` lacks, and
    each item of its list `list_key` merged into the item there with the same `by`, or
    added after the others."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.error import YAMLError
    try:
        yaml = _yaml_like(text)
        doc = yaml.load(text)
    except YAMLError as e:
        mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise Unparsable(where + (problem or " ".join(str(e).split()))) from None
    if doc is None:  # empty, or only comments: keep them above
        return text + ("" if not text or text.endswith("\n") else "\n") + fresh
    if not isinstance(doc, CommentedMap):
        raise Unexpected("its top level is not a mapping of keys")
    new = yaml.load(fresh)
    for i, (key, value) in enumerate(new.items()):
        if key not in doc and key != list_key:
            doc.insert(i, key, value)
    items = doc.get(list_key)
    if list_key not in doc:
        _append(doc, list_key, new[list_key])
    elif items is None:
        doc[list_key] = new[list_key]
    elif not isinstance(items, CommentedSeq):
        raise Unexpected(f"{list_key} is not a list")
    else:
        if not items:
            items.fa.set_block_style()
        for item in new[list_key]:
            same = [x for x in items if isinstance(x, CommentedMap) and x.get(by) == item[by]]
            for x in same:
                _merge_map(x, item)
            if not same:
                _append(items, None, item)
    out = io.StringIO()
    yaml.dump(doc, out)
    if _plain(yaml.load(out.getvalue())) != _plain(doc):  # never write what reads otherwise
        raise ConfigFileError("Shoal's entries could not be added safely; nothing was "
                              f"changed. Add them by hand:\n{fresh}")
    return out.getvalue()


def _yaml_like(text: str) -> Any:
    """A round-trip YAML whose indentation is the text's own (the one that writes the text
    back unchanged, else the closest)."""
    from ruamel.yaml import YAML
    first = next((ln for ln in text.splitlines() if ln.strip() and
                  not ln.lstrip().startswith("#")), "")
    best: tuple[float, Any] = (-1.0, None)
    for mapping, sequence, offset in [(2, 4, 2), (2, 2, 0), (4, 4, 2), (4, 6, 4), (4, 4, 0),
                                      (2, 4, 0), (4, 2, 0), (3, 3, 0), (3, 5, 3)]:
        yaml = YAML()
        yaml.preserve_quotes = True
        yaml.width = 4096  # long lines stay one line
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        yaml.explicit_start = first.startswith("---")
        out = io.StringIO()
        yaml.dump(yaml.load(text), out)
        if out.getvalue() == text:
            return yaml
        score = difflib.SequenceMatcher(None, text.splitlines(),
                                        out.getvalue().splitlines()).ratio()
        if score > best[0]:
            best = (score, yaml)
    return best[1]


def _merge_map(dst: Any, src: Any) -> None:
    from ruamel.yaml.comments import CommentedMap
    for key, value in src.items():
        if isinstance(value, CommentedMap) and isinstance(dst.get(key), CommentedMap):
            _merge_map(dst[key], value)
        elif key not in dst:
            _append(dst, key, value)
        elif _plain(dst[key]) != _plain(value):
            dst[key] = value


def _append(node: Any, key: Any, value: Any) -> None:
    """Add to the end of a mapping or list, with the comment lines that followed its old
    last entry (which ruamel keeps on that entry) moved below the new one."""
    moved = _take_trailing(node)
    if key is None:
        node.append(value)
    else:
        node[key] = value
    if moved is not None:
        _give_trailing(node, moved)


def _last_slot(node: Any) -> tuple[Any, Any, int] | None:
    """Where ruamel keeps the comment after a collection's last line: (the collection
    that holds it, the key or index, the slot)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    while isinstance(node, CommentedMap | CommentedSeq) and len(node):
        key = next(reversed(node)) if isinstance(node, CommentedMap) else len(node) - 1
        value = node[key]
        if isinstance(value, CommentedMap | CommentedSeq) and len(value) \
                and not value.fa.flow_style():
            node = value
            continue
        return node, key, 2 if isinstance(node, CommentedMap) else 0
    return None


def _take_trailing(node: Any) -> Any:
    import copy
    slot = _last_slot(node)
    if slot is None:
        return None
    holder, key, i = slot
    entry = holder.ca.items.get(key)
    token = entry[i] if entry and len(entry) > i else None
    if token is None:
        return None
    eol, _, rest = token.value.partition("\n")
    if not rest.strip():
        return None
    entry[i] = None
    if eol.strip():
        entry[i] = copy.copy(token)
        entry[i].value = eol + "\n"
    moved = copy.copy(token)
    moved.value = "\n" + rest
    return moved


def _give_trailing(node: Any, token: Any) -> None:
    slot = _last_slot(node)
    if slot is None:
        return
    holder, key, i = slot
    entry = holder.ca.items.setdefault(key, [None] * (4 if i == 2 else 2))
    if entry[i] is None:
        entry[i] = token
    else:
        entry[i].value = entry[i].value.rstrip("\n") + token.value


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x
