"""Every relative link in README.md and docs/ leads to a file that exists, and its #anchor to a heading there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def documents(repo: Path) -> list[Path]:
    """README.md and every Markdown page under docs/ (the ADRs included)."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are code, not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a page's headings make, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, repo: Path) -> list[str]:
    """`<page>: <target>: <why>` for each relative link of the page that does not resolve."""
    problems = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(repo)}: {target}"
        if not resolved.exists():
            problems.append(f"{where}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading makes #{anchor} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", documents(REPO), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page, REPO) == []


def test_the_readme_links_every_guide() -> None:
    """The README is the front door: each page by reader is one link away."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in ("user-guide.md", "operator-guide.md", "security.md", "developer-guide.md", "configuration.md",
                 "spec-reference.md",
                 "adr/README.md"):
        assert f"(docs/{page})" in readme, page


def test_the_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    """The check can fail: a link to no file, to no heading, and one inside code that is not a link."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Run it: `make up`\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/guide.md#run-it-make-up) [web](https://example.com/x) [self](#top)\n"
        "[gone](docs/missing.md) [bad anchor](docs/guide.md#nowhere) ![img](docs/none.png)\n"
        "`[code](docs/not-a-link.md)`\n\n```\n[fenced](docs/also-not.md)\n```\n\n# Top\n",
        encoding="utf-8")
    assert broken_links(page, tmp_path) == [
        "README.md: docs/missing.md: no such file",
        "README.md: docs/guide.md#nowhere: no heading makes #nowhere in guide.md",
        "README.md: docs/none.png: no such file",
    ]


@pytest.mark.parametrize(("heading", "anchor"), [
    pytest.param("Run it as a service: `make up`", "run-it-as-a-service-make-up", id="code-and-colon"),
    pytest.param("Installing on Kubernetes (Helm)", "installing-on-kubernetes-helm", id="parentheses"),
    pytest.param("The console: what a person sees", "the-console-what-a-person-sees", id="colon"),
    pytest.param("Decisions (ADRs)", "decisions-adrs", id="capitals"),
])
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
