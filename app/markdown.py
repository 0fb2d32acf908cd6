"""A reply's text as the chat shows it: prose rendered as GitHub-flavoured markdown by Qt
itself with HTML switched off (a model's output is never HTML, so "<b>" shows as written),
and fenced code apart, with the language its fence names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtGui import QTextDocument

FENCE = re.compile(r"^[ \t]*```(.*)$", re.MULTILINE)
FEATURES = (QTextDocument.MarkdownFeature.MarkdownDialectGitHub
            | QTextDocument.MarkdownFeature.MarkdownNoHTML)


@dataclass(frozen=True)
class Segment:
    kind: str  # "text" | "code"
    text: str
    info: str = ""  # a code fence's info string ("python", "js title=x"...)


def split_fences(text: str) -> list[Segment]:
    """Prose and ``` fenced code, in order. A fence still open (a reply mid-stream) runs
    to the end of the text."""
    parts: list[Segment] = []
    pos, in_code, info = 0, False, ""
    for m in FENCE.finditer(text):
        chunk = text[pos:m.start()]
        if in_code:
            parts.append(Segment("code", chunk.removesuffix("\n"), info))
        elif chunk.strip():
            parts.append(Segment("text", chunk.strip("\n")))
        pos = min(m.end() + 1, len(text))  # skip the fence line and its newline
        in_code, info = not in_code, m.group(1).strip()
    rest = text[pos:]
    if in_code:
        parts.append(Segment("code", rest, info))
    elif rest.strip() or not parts:
        parts.append(Segment("text", rest.strip("\n") if parts else rest))
    return parts


def markdown_document(text: str) -> QTextDocument:
    """The prose as a document: markdown (GitHub dialect), never HTML."""
    doc = QTextDocument()
    doc.setMarkdown(text, FEATURES)
    return doc


def to_html(text: str) -> str:
    """Qt's own HTML for the markdown `text` (safe to show: no HTML of the model's)."""
    return markdown_document(text).toHtml()


def to_plain(text: str) -> str:
    """What a reader sees of the markdown `text`, without its marks."""
    return markdown_document(text).toPlainText()
