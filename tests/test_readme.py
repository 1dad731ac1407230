"""The README's snippets run as pasted, and the documents stay a manual.

Every ```python block of README.md runs in a fresh Python process in an empty directory (what a
reader who pastes it gets); shell blocks are examples and are not run. The evaluation snippet is
also checked against the layer-input path, the paths the README writes into a checkout are
git-ignored, and README.md, BUILD.md and docs/ carry no dates, commit hashes or issue numbers
(those belong in BENCHMARKS.md's host lines and CHANGELOG.md)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Runs a process per snippet (the markers: BUILD.md, "Tests").
pytestmark = pytest.mark.subprocess


def python_blocks(text):
    """(the heading above it, its code) for each ```python block of a Markdown text."""
    blocks, heading, fence, code = [], "", None, []
    for line in text.splitlines(keepends=True):
        if fence is None and line.startswith("```"):
            fence, code = line[3:].strip(), []
        elif fence is not None and line.rstrip() == "```":
            if fence == "python":
                blocks.append((heading, "".join(code)))
            fence = None
        elif fence is not None:
            code.append(line)
        elif line.startswith("#"):  # a heading: outside fences only (shell comments are not)
            heading = line.lstrip("#").strip()
    return blocks


def block_ids(blocks):
    seen = {}
    ids = []
    for heading, _ in blocks:
        seen[heading] = seen.get(heading, 0) + 1
        ids.append(heading if seen[heading] == 1 else f"{heading} ({seen[heading]})")
    return ids


README_BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_python_blocks_finds_each_block_under_its_heading():
    text = "# A\n```python\nx = 1\n```\n## B\n```sh\n# not a heading\n```\n```python\ny = 2\n```\n"
    assert python_blocks(text) == [("A", "x = 1\n"), ("B", "y = 2\n")]
    assert len(README_BLOCKS) >= 8  # one per job at least


@pytest.mark.large
@pytest.mark.parametrize("code", [code for _, code in README_BLOCKS],
                         ids=block_ids(README_BLOCKS))
def test_every_python_block_of_the_readme_runs_as_pasted(code, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # a reader's default
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "`shuffle=True` was passed, but will be ignored" not in done.stderr, done.stderr


def readme_block(heading):
    blocks = [code for title, code in README_BLOCKS if title == heading]
    assert blocks, f"no python block under {heading!r} in README.md"
    return blocks[0]


@pytest.mark.large
def test_the_evaluation_snippet_reads_with_the_evaluation_settings_throughout():
    """Its memory length, clamp_len and same_length all come from config.eval_settings(), which
    differ from training's in every field: mixing them would show in the loss."""
    namespace = {}
    exec(readme_block("Evaluate and generate from Python"), namespace)
    model, tokens, config = namespace["model"], namespace["tokens"], namespace["config"]
    settings = config.eval_settings()
    assert (settings["tgt_len"], settings["mem_len"]) != (config.tgt_len, config.mem_len)
    assert settings["same_length"] != config.same_length
    T = settings["tgt_len"]
    memory = model.init_memory(tokens.shape[0], mem_len=settings["mem_len"])  # by hand
    for start in range(0, 4 * T, T):
        want, memory = model(tokens[:, start:start + T], memory,
                             targets=tokens[:, start + 1:start + T + 1],
                             clamp_len=settings["clamp_len"],
                             same_length=settings["same_length"])
    np.testing.assert_allclose(namespace["nll"], want, atol=1e-5)
    assert namespace["new_tokens"].shape == (tokens.shape[0], 20)


def written_paths(text):
    """The checkout paths the README's commands and snippets write: --output_dir/--model_dir
    values and the data/, runs/, exports/ paths named in its Python."""
    paths = set(re.findall(r"--(?:output_dir|model_dir)=((?!gs://)[\w./-]+)", text))
    for _, code in python_blocks(text):
        paths |= set(re.findall(r"[\"']((?:data|runs|exports)/[\w./-]+)[\"']", code))
    return paths


def test_readme_output_paths_are_git_ignored():
    """What the README's commands write into the checkout (`--output_dir=exports/tiny`,
    `model.export("exports/mini")`, ...) must not show up as untracked files."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    written = written_paths(README.read_text(encoding="utf-8"))
    assert {"exports/tiny", "exports/mini", "data/mini"} <= written
    for path in sorted(written):
        check = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", f"{path}/x"])
        assert check.returncode == 0, f"{path}/ (written by the README) is not ignored"


# -- a manual, not a diary ---------------------------------------------------------------------
DIARY = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a commit hash": re.compile(r"`[0-9a-f]{7,40}`"),
    "an issue number": re.compile(r"(?<![\w&/])#\d+\b"),
}


def diary_entries(text):
    """(what, the matched text, line number) for each date, commit hash or issue reference."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in DIARY.items():
            found += [(what, match.group(0), number) for match in pattern.finditer(line)]
    return found


def manual_pages():
    return [ROOT / "README.md", ROOT / "BUILD.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_manual_has_no_dates_commit_hashes_or_issue_numbers():
    found = {str(path.relative_to(ROOT)): diary_entries(path.read_text(encoding="utf-8"))
             for path in manual_pages()}
    assert len(found) >= 4
    assert not any(found.values()), {page: hits for page, hits in found.items() if hits}


def test_diary_entries_are_found():
    text = ("run on 2026-11-28\nat `fb21212`, see #34 and (#19)\n"
            "keep: `tiny`, `deadline`, &#39;, a/#2, `cafe` 0x2026\n")
    assert diary_entries(text) == [("a date", "2026-11-28", 1), ("a commit hash", "`fb21212`", 2),
                                   ("an issue number", "#34", 2), ("an issue number", "#19", 2)]
