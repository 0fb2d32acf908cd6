"""Syntax highlighting for code blocks in replies, keyed by the fence's language.

Qt has no highlighter of its own and the app adds no dependency for one, so each language
is a handful of regular expressions: keywords, types and builtins, strings, numbers and
comments (block comments across lines too). Colours come from app/theme.py, so they follow
the appearance."""

from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtGui import QFont, QSyntaxHighlighter, QTextCharFormat, QTextDocument

from app import theme

ALIASES = {"py": "python", "python3": "python", "js": "javascript", "jsx": "javascript",
           "ts": "typescript", "tsx": "typescript", "sh": "bash", "shell": "bash",
           "zsh": "bash", "console": "bash", "rs": "rust", "c++": "cpp", "cc": "cpp",
           "h": "c", "hpp": "cpp", "golang": "go", "jsonc": "json"}
NAMES = {"python": "Python", "javascript": "JavaScript", "typescript": "TypeScript",
         "bash": "Shell", "json": "JSON", "rust": "Rust", "c": "C", "cpp": "C++", "go": "Go"}


@dataclass(frozen=True)
class Language:
    keywords: tuple[str, ...]
    types: tuple[str, ...] = ()
    line_comment: str | None = "#"
    block_comment: tuple[str, str] | None = None
    strings: str = r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\''


C_KEYWORDS = ("auto break case const continue default do else enum extern for goto if "
              "inline register restrict return sizeof static struct switch typedef union "
              "volatile while").split()
C_TYPES = "void char short int long float double signed unsigned bool size_t".split()
JS_KEYWORDS = ("async await break case catch class const continue debugger default delete "
               "do else export extends finally for from function if import in instanceof "
               "let new of return static super switch this throw try typeof var void while "
               "yield").split()
JS_TYPES = "true false null undefined NaN Infinity console Promise Array Object".split()

LANGUAGES = {
    "python": Language(
        ("and as assert async await break class continue def del elif else except finally "
         "for from global if import in is lambda nonlocal not or pass raise return try "
         "while with yield match case").split(),
        ("True False None self int str float bool list dict set tuple print len range "
         "type object Exception").split(),
        strings=r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|[rbfu]*"(?:\\.|[^"\\])*"'
                r'|[rbfu]*\'(?:\\.|[^\'\\])*\''),
    "javascript": Language(tuple(JS_KEYWORDS), tuple(JS_TYPES), "//", ("/*", "*/"),
                           r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`(?:\\.|[^`\\])*`'),
    "typescript": Language(
        (*JS_KEYWORDS, *"interface type enum implements private public readonly as "
         "declare namespace abstract keyof".split()),
        (*JS_TYPES, *"string number boolean any unknown never".split()), "//",
        ("/*", "*/"), r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`(?:\\.|[^`\\])*`'),
    "bash": Language(
        ("if then else elif fi for while until do done case esac function in return "
         "export local readonly set unset source exit").split(),
        "echo cd ls grep sed awk cat curl pip python git sudo make".split()),
    "json": Language(("true", "false", "null"), line_comment=None,
                     strings=r'"(?:\\.|[^"\\])*"'),
    "rust": Language(
        ("as async await break const continue crate else enum extern fn for if impl in "
         "let loop match mod move mut pub ref return static struct super trait type "
         "unsafe use where while dyn").split(),
        ("Self self bool char str String Vec Option Some None Result Ok Err Box i8 i16 "
         "i32 i64 i128 isize u8 u16 u32 u64 u128 usize f32 f64 true false").split(),
        "//", ("/*", "*/"), r'"(?:\\.|[^"\\])*"'),
    "c": Language(tuple(C_KEYWORDS), (*C_TYPES, "NULL", "true", "false"), "//",
                  ("/*", "*/")),
    "cpp": Language(
        (*C_KEYWORDS, *"class namespace template typename public private protected "
         "virtual override new delete using try catch throw constexpr noexcept "
         "nullptr this operator".split()),
        (*C_TYPES, *"std string vector map auto true false".split()), "//", ("/*", "*/")),
    "go": Language(
        ("break case chan const continue default defer else fallthrough for func go goto "
         "if import interface map package range return select struct switch type "
         "var").split(),
        ("bool byte error float32 float64 int int32 int64 rune string uint uint8 uint32 "
         "uint64 nil true false iota make len append").split(),
        "//", ("/*", "*/"), r'"(?:\\.|[^"\\])*"|`[^`]*`|\'(?:\\.|[^\'\\])*\''),
}
NUMBER = re.compile(r"\b(?:0[xX][0-9a-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\b")
JSON_KEY = re.compile(r'"(?:\\.|[^"\\])*"(?=\s*:)')


def language_of(fence_info: str) -> str | None:
    """The language a fence names ("```py title=x" → "python"); None when unknown."""
    word = (fence_info.strip().split() or [""])[0].lower().lstrip("{.").rstrip("}")
    word = ALIASES.get(word, word)
    return word if word in LANGUAGES else None


def display_name(fence_info: str) -> str:
    """What the block's header says: the language's name, or the fence's word as written."""
    lang = language_of(fence_info)
    if lang:
        return NAMES[lang]
    return (fence_info.strip().split() or [""])[0]


class CodeHighlighter(QSyntaxHighlighter):
    """Highlights a document as `language` (a key of LANGUAGES); plain for None."""

    def __init__(self, document: QTextDocument, language: str | None):
        super().__init__(document)
        self.language = LANGUAGES.get(language or "")
        self.is_json = language == "json"
        self._patterns: list[tuple[re.Pattern[str], str]] = []
        self._formats: dict[str, QTextCharFormat] = {}
        lang = self.language
        if lang is not None:
            words = "|".join(map(re.escape, lang.keywords))
            if words:
                self._patterns.append((re.compile(rf"\b(?:{words})\b"), "keyword"))
            types = "|".join(map(re.escape, lang.types))
            if types:
                self._patterns.append((re.compile(rf"\b(?:{types})\b"), "type"))
            self._patterns.append((NUMBER, "number"))
        self.refresh_colours()

    def refresh_colours(self) -> None:
        """Take the colours of the palette in force (after an appearance switch)."""
        for kind in theme.SYNTAX:
            f = QTextCharFormat()
            f.setForeground(theme.syntax(kind))
            if kind == "keyword":
                f.setFontWeight(QFont.Weight.DemiBold)
            if kind == "comment":
                f.setFontItalic(True)
            self._formats[kind] = f
        self.rehighlight()

    def highlightBlock(self, text: str) -> None:  # noqa: N802 - Qt's name
        lang = self.language
        if lang is None:
            return
        for pattern, kind in self._patterns:
            for m in pattern.finditer(text):
                self.setFormat(m.start(), m.end() - m.start(), self._formats[kind])
        # Strings and comments last: what is inside them is neither keyword nor number.
        taken: list[tuple[int, int]] = []
        for m in re.finditer(lang.strings, text):
            kind = "type" if self.is_json and JSON_KEY.match(text, m.start()) else "string"
            self.setFormat(m.start(), m.end() - m.start(), self._formats[kind])
            taken.append((m.start(), m.end()))
        if lang.line_comment:
            start = _outside(text, lang.line_comment, taken)
            if start >= 0:
                self.setFormat(start, len(text) - start, self._formats["comment"])
        self._block_comments(text, taken)

    def _block_comments(self, text: str, taken: list[tuple[int, int]]) -> None:
        """/* ... */ across lines: block state 1 means 'inside a comment'."""
        self.setCurrentBlockState(0)
        pair = self.language.block_comment if self.language else None
        if pair is None:
            return
        opener, closer = pair
        start = 0 if self.previousBlockState() == 1 else _outside(text, opener, taken)
        while start >= 0:
            end = text.find(closer, start + (0 if self.previousBlockState() == 1 and start == 0
                                              else len(opener)))
            if end < 0:
                self.setCurrentBlockState(1)
                self.setFormat(start, len(text) - start, self._formats["comment"])
                return
            self.setFormat(start, end + len(closer) - start, self._formats["comment"])
            start = _outside(text, opener, taken, end + len(closer))


def _outside(text: str, token: str, taken: list[tuple[int, int]], start: int = 0) -> int:
    """The first `token` at or after `start` that is not inside a string; -1 if none."""
    i = text.find(token, start)
    while i >= 0 and any(a <= i < b for a, b in taken):
        i = text.find(token, i + 1)
    return i
