"""A small editor for JSON with comments (JSONC: `//` and `/* */` comments, trailing
commas), as OpenCode and Claude Code read it: set or remove one key by changing only that
key's text, so everything else of the file (comments, layout, key order) stays as it was.

No library on PyPI did this for us: jsonc-edit runs Node.js and fetches an npm package at
run time, json5kit has no block comments, jsoncgx no trailing commas, and jsonc-sdict
needs Python 3.13."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]  # not in typeshed
from typing import Any, NoReturn

MAX_DEPTH = 256  # deeper than any config; a hostile file gets an error, not a RecursionError
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}


class JsoncError(ValueError):
    """The text is not JSONC; says where."""


class NotAnObject(JsoncError):
    """A value on the way to the key to set is not an object (so it isn't replaced)."""


@dataclass
class Node:
    """A value and where its text is: text[start:end]."""
    start: int
    end: int
    value: Any
    members: list[Member] | None = None  # an object's, in the file's order

    def member(self, key: str) -> Member | None:
        """The member with this key (the last one if the file repeats it, as JSON does)."""
        found = [m for m in self.members or [] if m.key == key]
        return found[-1] if found else None


@dataclass
class Member:
    key: str
    key_start: int
    value: Node
    comma: int | None = field(default=None)  # where the comma after it is, if there is one


def loads(text: str) -> Any:
    """The value of a JSONC text."""
    return _Parser(text).parse().value


def set_value(text: str, path: Sequence[str], value: Any) -> str:
    """The text with the value at `path` (object keys from the top) set to `value`; the
    objects on the way are added where missing."""
    root = node = _Parser(text).parse()
    for i, key in enumerate(path):
        _expect_object(node, path[:i])
        m = node.member(key)
        if m is None:
            for k in reversed(path[i + 1:]):
                value = {k: value}
            return _insert(text, node, key, value, node is root)
        node = m.value
    if _same(node.value, value):
        return text
    indent = _line_indent(text, node.start)
    return text[:node.start] + _dump(value, _unit(text), indent, _newline(text)) + \
        text[node.end:]


def merge(text: str, path: Sequence[str], values: Mapping[str, Any]) -> str:
    """The text with each of `values` set under `path`; where a value is a mapping and the
    file has an object there, that object is merged into rather than replaced."""
    for key, value in values.items():
        node = _find(_Parser(text).parse(), [*path, key])
        if isinstance(value, Mapping) and node is not None:
            _expect_object(node, [*path, key])  # a value of the user's is not replaced
            text = merge(text, [*path, key], value)
        else:
            text = set_value(text, [*path, key], value)
    return text


def remove(text: str, path: Sequence[str]) -> str:
    """The text without the key at `path` (unchanged if there is none)."""
    parent = _find(_Parser(text).parse(), path[:-1])
    if parent is None or parent.members is None:
        return text
    members = parent.members
    for i in reversed(range(len(members))):  # every copy of a repeated key
        m = members[i]
        if m.key != path[-1]:
            continue
        last = i == len(members) - 1
        start, end = m.key_start, (m.comma + 1 if m.comma is not None else m.value.end)
        # the line goes too (with the member's own comment) when the member was alone on it
        line_start = text.rfind("\n", 0, start) + 1
        stop = _line_end(text, end, len(text))
        if not text[line_start:start].strip() and (stop >= len(text) or text[stop] in "\r\n"):
            start, end = line_start, text.find("\n", stop) + 1 or len(text)
        text = text[:start] + text[end:]
        prev = members[i - 1] if i else None
        if last and m.comma is None and prev is not None and prev.comma is not None:
            text = text[:prev.comma] + text[prev.comma + 1:]  # the one before is last now
        return remove(text, path)
    return text


def _find(node: Node, path: Sequence[str]) -> Node | None:
    for key in path:
        m = node.member(key) if node.members is not None else None
        if m is None:
            return None
        node = m.value
    return node


def _expect_object(node: Node, path: Sequence[str]) -> None:
    if node.members is None:
        where = ".".join(path) or "the top level"
        raise NotAnObject(f"{where} is {json.dumps(node.value)[:40]}, not an object")


def _insert(text: str, obj: Node, key: str, value: Any, root: bool) -> str:
    """Add `"key": value` as the object's last member, laid out as its other members."""
    nl, unit = _newline(text), _unit(text)
    name = json.dumps(key, ensure_ascii=False)
    members = obj.members or []
    if not members:
        inner = text[obj.start + 1:obj.end - 1]
        if "\n" not in inner and not root and "\n" not in text.strip():  # a one-line file
            return text[:obj.start + 1] + f"{name}: {_dump(value, None, '', nl)}" + \
                text[obj.end - 1:]
        outer = _line_indent(text, obj.start)
        child = outer + unit
        close = "" if "\n" in inner else nl + outer
        return text[:obj.start + 1] + f"{nl}{child}{name}: {_dump(value, unit, child, nl)}" \
            + close + text[obj.start + 1:]
    last = members[-1]
    after = last.comma + 1 if last.comma is not None else last.value.end
    trailing = "," if last.comma is not None else ""  # keep the file's style
    if "\n" not in text[obj.start:members[0].key_start]:  # all on one line
        new = f" {name}: {_dump(value, None, '', nl)}{trailing}"
        if last.comma is None:
            new = "," + new
        return text[:after] + new + text[after:]
    indent = _line_indent(text, last.key_start)
    if text[text.rfind("\n", 0, last.key_start) + 1:last.key_start].strip():
        indent = _line_indent(text, obj.start) + unit  # the key shares its line
    pos = _line_end(text, after, obj.end - 1)
    new = f"{nl}{indent}{name}: {_dump(value, unit, indent, nl)}{trailing}"
    text = text[:pos] + new + text[pos:]
    if last.comma is None:
        text = text[:last.value.end] + "," + text[last.value.end:]
    return text


def _line_end(text: str, pos: int, limit: int) -> int:
    """Where the line that `pos` is on ends, if only blanks and comments follow `pos` on
    it (a comment there belongs to the member before); else `pos`."""
    i = pos
    while i < limit:
        c = text[i]
        if c in "\r\n":
            return i
        if c in " \t":
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            return limit if end < 0 else (end - 1 if text[end - 1] == "\r" else end)
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 2
        else:
            break
    return pos


def _line_indent(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    m = re.match(r"[ \t]*", text[start:])
    return m.group() if m else ""


def _unit(text: str) -> str:
    """The file's indentation step: the first indented line's indentation (2 spaces if
    nothing is indented)."""
    m = re.search(r"\n([ \t]+)[\"}\]]", text)
    return m.group(1) if m else "  "


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _dump(value: Any, unit: str | None, indent: str, nl: str) -> str:
    return json.dumps(value, indent=unit, ensure_ascii=False).replace("\n", nl + indent)


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class _Parser:
    def __init__(self, text: str):
        self.text = text

    def parse(self) -> Node:
        i = self.skip(1 if self.text.startswith("\ufeff") else 0)
        if i >= len(self.text):
            raise JsoncError("the file is empty")
        node = self.value(i, 0)
        i = self.skip(node.end)
        if i < len(self.text):
            self.fail(i, "more text after the end of the value")
        return node

    def skip(self, i: int) -> int:
        """Past blanks and comments."""
        text = self.text
        while i < len(text):
            if text[i] in " \t\r\n":
                i += 1
            elif text.startswith("//", i):
                end = text.find("\n", i)
                i = len(text) if end < 0 else end + 1
            elif text.startswith("/*", i):
                end = text.find("*/", i + 2)
                if end < 0:
                    self.fail(i, "a /* comment that never ends")
                i = end + 2
            else:
                break
        return i

    def value(self, i: int, depth: int) -> Node:
        if depth > MAX_DEPTH:
            self.fail(i, f"nested more than {MAX_DEPTH} deep")
        text = self.text
        c = text[i] if i < len(text) else ""
        if c == "{":
            return self.obj(i, depth)
        if c == "[":
            return self.array(i, depth)
        if c == '"':
            s, end = self.string(i)
            return Node(i, end, s)
        m = _NUMBER.match(text, i)
        if m:
            return Node(i, m.end(), json.loads(m.group()))
        for word, v in _LITERALS.items():
            if text.startswith(word, i):
                return Node(i, i + len(word), v)
        self.fail(i, "expected a value" if c else "the text ends too early")

    def string(self, i: int) -> tuple[str, int]:
        try:
            return scanstring(self.text, i + 1, True)
        except json.JSONDecodeError as e:
            self.fail(e.pos, e.msg.removesuffix(" at").lower())

    def obj(self, start: int, depth: int) -> Node:
        members: list[Member] = []
        i = self.skip(start + 1)
        while not self.text.startswith("}", i):
            if not self.text.startswith('"', i):
                self.fail(i, "expected a \"key\" or '}'")
            key_start = i
            key, i = self.string(i)
            i = self.skip(i)
            if not self.text.startswith(":", i):
                self.fail(i, "expected ':'")
            value = self.value(self.skip(i + 1), depth + 1)
            member = Member(key, key_start, value)
            members.append(member)
            i = self.skip(value.end)
            if self.text.startswith(",", i):
                member.comma = i
                i = self.skip(i + 1)
            elif not self.text.startswith("}", i):
                self.fail(i, "expected ',' or '}'")
        return Node(start, i + 1, {m.key: m.value.value for m in members}, members)

    def array(self, start: int, depth: int) -> Node:
        items: list[Any] = []
        i = self.skip(start + 1)
        while not self.text.startswith("]", i):
            item = self.value(i, depth + 1)
            items.append(item.value)
            i = self.skip(item.end)
            if self.text.startswith(",", i):
                i = self.skip(i + 1)
            elif not self.text.startswith("]", i):
                self.fail(i, "expected ',' or ']'")
        return Node(start, i + 1, items)

    def fail(self, pos: int, what: str) -> NoReturn:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - self.text.rfind("\n", 0, pos)
        raise JsoncError(f"line {line}, column {col}: {what}")

