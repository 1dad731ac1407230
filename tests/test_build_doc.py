"""docs/faults.md's "What happens when …" table says, per fault, which tests show it: every test
it names must exist, so that a renamed or removed test cannot leave a row vouched for by nothing."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE_HEADING = "# What happens when"


def table_test_column(text):
    """The last cell of each row of the table under TABLE_HEADING (header rows left out)."""
    start = text.index(TABLE_HEADING)
    end = text.find("\n## ", start + len(TABLE_HEADING))
    end = len(text) if end < 0 else end
    rows = [line for line in text[start:end].splitlines() if line.startswith("|")][2:]
    return [row.rstrip().rstrip("|").rsplit("|", 1)[-1] for row in rows]


def named_tests(cell):
    """(file, test or None) for each `tests/x.py::test_y`, `x.py::test_y`, `::test_y` (the last
    file named before it) and `x.py` (the whole file) in a cell."""
    current = None
    for ref in re.findall(r"`([^`]*)`", cell):
        if ref.startswith("::"):
            yield current, ref[2:].split("[")[0]
        elif ref.endswith(".py") or ".py::" in ref:
            current, _, name = ref.partition("::")
            yield current, name.split("[")[0] or None


def defined_tests(path):
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_")}


def missing_tests(text, root):
    """Every table reference that names no existing test file or function, as 'file::name'."""
    test_files = {}
    for folder, _, files in os.walk(os.path.join(root, "tests")):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(folder, name)
                test_files[os.path.relpath(path, root)] = path
    missing, references, defined = [], 0, {}
    for cell in table_test_column(text):
        for file_ref, name in named_tests(cell):
            references += 1
            suffix = file_ref if file_ref.startswith("tests/") else "/" + str(file_ref)
            paths = [p for rel, p in test_files.items()
                     if rel == suffix or rel.endswith(suffix)]
            if len(paths) == 1 and paths[0] not in defined:  # each file parsed once
                defined[paths[0]] = defined_tests(paths[0])
            if len(paths) != 1 or (name and name not in defined[paths[0]]):
                missing.append(f"{file_ref}::{name}" if name else str(file_ref))
    return references, missing


def test_every_test_the_what_happens_when_table_names_exists():
    with open(os.path.join(ROOT, "docs", "faults.md"), encoding="utf-8") as handle:
        text = handle.read()
    references, missing = missing_tests(text, ROOT)
    assert references > 100, references  # the table was found and read
    assert not missing, f"docs/faults.md's table names tests that do not exist: {missing}"


def test_a_renamed_test_is_reported(tmp_path):
    tests = tmp_path / "tests"
    (tests / "data").mkdir(parents=True)
    (tests / "test_a.py").write_text("def test_one():\n    pass\n")
    (tests / "data" / "test_b.py").write_text("def test_two():\n    pass\n")
    text = ("## What happens when …\n| fault | sees | test |\n|---|---|---|\n"
            "| x | y | `tests/test_a.py::test_one`, `::test_gone`, `test_b.py::test_two[p]` |\n"
            "| x | y | `tests/test_c.py` |\n\n## Next\n| a | `tests/test_d.py::test_e` |\n")
    assert missing_tests(text, str(tmp_path)) == (4, ["tests/test_a.py::test_gone",
                                                      "tests/test_c.py"])
