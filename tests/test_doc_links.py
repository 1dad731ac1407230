"""Every cross-reference of the documents and the code resolves.

Two forms: a relative Markdown link, ``[text](docs/data.md#atomic-writes)`` (the file exists, and
so does the heading its anchor names), and a reference by heading, ``BUILD.md, "Tests"`` or
``[docs/training.md](docs/training.md), "Training on JAX"`` (the file exists and has a heading
of that text, or one that continues it after a colon: "Input pipelines" for "Input pipelines:
tf.data autotuning off"), in any *.md or *.py file of the repository."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", "build", "dist", "node_modules", ".pytest_cache"}

LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
# `X.md, "Heading"`, `X.md "Heading"` and `[X.md](X.md), "Heading"`; README, BUILD and
# BENCHMARKS are also named without .md.
BY_HEADING = re.compile(r"(?<![\w/.-])((?:[\w./-]+/)?[\w-]+\.md|README|BUILD|BENCHMARKS)"
                        r"(?:\]\(([^)\s#]+)[^)\s]*\))?,? \"([^\"\n]+)\"")


def repository_files(*suffixes):
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if path.suffix in suffixes and path.is_file() and not SKIP.intersection(parts) \
                and not any(part.endswith(".egg-info") for part in parts):
            yield path


def outside_code_blocks(text):
    """A Markdown text with its fenced code blocks blanked (the line count kept)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def headings(path):
    """The heading texts of a Markdown file, backticks removed."""
    text = outside_code_blocks(path.read_text(encoding="utf-8"))
    return [m.group(1).replace("`", "").strip()
            for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)]


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def resolve(name, source, link=""):
    """The file a reference names: its link's target, else the name relative to the referring
    file, else to the root."""
    if link:
        target = (source.parent / link).resolve()
        return target if target.is_file() else None
    if name in ("README", "BUILD", "BENCHMARKS"):
        name += ".md"
    for base in (source.parent, ROOT):
        candidate = (base / name).resolve()
        if candidate.is_file():
            return candidate
    return None


def flattened(text, suffix):
    """Text whose wrapped lines are joined, so that a reference split over two comment or
    docstring lines is found (Python's comment markers dropped at the line starts)."""
    if suffix == ".py":
        text = re.sub(r"\n[ \t]*#[ \t]?", " ", text)
    return re.sub(r"[ \t]*\n[ \t]*", " ", text)


def broken_links(path):
    """(the link, why) for each relative Markdown link of `path` that does not resolve."""
    broken = []
    for target in LINK.findall(outside_code_blocks(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        name, _, fragment = target.partition("#")
        file = path if not name else (path.parent / name).resolve()
        if not file.exists():
            broken.append((target, "no such file"))
        elif fragment and file.suffix == ".md" and \
                fragment not in {anchor(h) for h in headings(file)}:
            broken.append((target, f"no heading with the anchor #{fragment}"))
    return broken


def broken_heading_references(path):
    """(the reference, why) for each `X.md, "Heading"` of `path` that does not resolve."""
    text = path.read_text(encoding="utf-8")  # code blocks too: their comments refer to pages
    broken = []
    for name, link, heading in BY_HEADING.findall(flattened(text, path.suffix)):
        file = resolve(name, path, link)
        if file is None:
            broken.append((f'{name}, "{heading}"', "no such file"))
        elif not any(h == heading.replace("`", "") or h.startswith(heading + ": ")
                     for h in headings(file)):
            broken.append((f'{name}, "{heading}"', f"no such heading in {file.name}"))
    return broken


def test_every_relative_markdown_link_resolves():
    pages = list(repository_files(".md"))
    assert len(pages) >= 10
    found = {str(p.relative_to(ROOT)): broken_links(p) for p in pages}
    assert not any(found.values()), {page: bad for page, bad in found.items() if bad}


def test_every_reference_to_a_heading_resolves():
    files = [p for p in repository_files(".md", ".py") if p != Path(__file__).resolve()]
    found = {str(p.relative_to(ROOT)): broken_heading_references(p) for p in files}
    assert not any(found.values()), {page: bad for page, bad in found.items() if bad}


@pytest.fixture
def pages(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "BUILD.md").write_text("# Build\n\n## Map of the house\n\n```\n# not one\n```\n")
    (tmp_path / "docs" / "a.md").write_text(
        "# A\n\n## The model: one rule\n\n"
        "[ok](../BUILD.md#map-of-the-house), [ok](#the-model-one-rule), [web](https://x.org/y)\n"
        "[gone](b.md), [bad anchor](../BUILD.md#not-one), see ../BUILD.md, \"Map of the house\"\n"
        "and [BUILD.md](../BUILD.md), \"Tests\"\n")
    (tmp_path / "code.py").write_text('# the layout (BUILD.md,\n# "Map of the house"); docs/a.md,'
                                      ' "Gone"\nx = 1\n')
    return tmp_path


def test_broken_links_and_references_are_found(pages):
    assert broken_links(pages / "docs" / "a.md") == [
        ("b.md", "no such file"), ("../BUILD.md#not-one", "no heading with the anchor #not-one")]
    assert broken_heading_references(pages / "docs" / "a.md") == [
        ('BUILD.md, "Tests"', "no such heading in BUILD.md")]
    assert broken_heading_references(pages / "code.py") == [
        ('docs/a.md, "Gone"', "no such heading in a.md")]
