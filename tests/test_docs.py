"""The README and docs/ link only to files inside the repository, and every such link
resolves: a reader of a fresh clone (or of the repository on GitHub) can follow them all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodes import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_stay_inside_and_resolve(page: Path):
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the page
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(target)
    assert not bad, f"{page.name} links outside the repository or to nothing: {bad}"
