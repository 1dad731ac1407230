"""The markers are kept true (tests/marker_check.py): a test that starts a process without the
`subprocess` mark is listed, and so is one over the `expensive` threshold that the list lacks;
`--update-expensive` writes the list, which then marks it. Run on a small suite of its own."""

import pytest

pytest_plugins = ("pytester",)
pytestmark = pytest.mark.subprocess  # the small suite's tests start `true`, in this process

SUITE = """
import subprocess, time
import pytest

def test_starts_a_process_unmarked():
    subprocess.run(["true"])

@pytest.mark.subprocess
def test_starts_a_process_marked():
    subprocess.run(["true"])

def test_slow():
    time.sleep(0.5)

def test_quick():
    pass

@pytest.fixture(scope="module")
def slow_to_build():
    time.sleep(0.5)

def test_pays_the_module_fixture(slow_to_build):
    pass
"""


@pytest.fixture
def suite(pytester):
    pytester.makeini("[pytest]\nmarkers =\n    subprocess: starts a process\n"
                     "    expensive: measured cost\nexpensive_list = expensive.txt\n"
                     "expensive_seconds = 0.3\n")
    pytester.makeconftest("from marker_check import *\n")
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def section(result, title):
    """The lines of the end-of-run section whose header holds `title` ([] if there is none)."""
    lines = result.stdout.lines
    start = next((i for i, line in enumerate(lines) if title in line and "===" in line), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")),
               len(lines))
    return [line for line in lines[start + 1:end] if line]


def run(suite, *args):
    # in-process: marker_check is importable from this test's own sys.path (tests/)
    return suite.runpytest_inprocess("-p", "no:randomly", "-p", "no:xdist", *args)


def test_a_process_started_without_the_mark_is_listed(suite):
    result = run(suite)
    result.assert_outcomes(passed=5)
    listed = section(result, "without the subprocess mark")
    assert listed == ["test_suite.py::test_starts_a_process_unmarked: ['true']"], (
        result.stdout.str())


def test_an_expensive_test_is_listed_until_the_list_names_it(suite):
    """A test whose call is over the threshold; not one whose module fixture is (the fixture's
    cost would move to the next test that uses it, run after run)."""
    first = section(run(suite), "tests over 0.3 s not marked expensive")
    assert [line.split(":")[-2] for line in first[:-1]] == ["test_slow"], first

    run(suite, "--update-expensive").assert_outcomes(passed=5)
    listed = (suite.path / "expensive.txt").read_text()
    assert "test_suite.py::test_slow  # " in listed and "test_quick" not in listed, listed
    assert "test_pays_the_module_fixture" not in listed, listed

    again = run(suite)
    assert section(again, "not marked expensive") == [], again.stdout.str()
    inner = run(suite, "-m", "not expensive")
    inner.assert_outcomes(passed=4, deselected=1)


@pytest.mark.parametrize("selection", [("-m", "not expensive"), ("-k", "not gone")])
def test_a_filtered_run_adds_to_the_list_and_a_whole_run_rewrites_it(suite, selection):
    """`make test` (-m "not expensive"), or a run that -k selects, adds its tests over the
    threshold, keeping the listed ones it did not run; a whole run (`make test-all`) writes the
    list anew."""
    (suite.path / "expensive.txt").write_text("test_suite.py::test_gone  # 9.0 s\n")
    run(suite, *selection, "--update-expensive").assert_outcomes(passed=5)
    listed = (suite.path / "expensive.txt").read_text()
    assert "test_suite.py::test_gone  # 9.0 s" in listed, listed
    assert "test_suite.py::test_slow  # " in listed and "test_quick" not in listed, listed

    run(suite, "--update-expensive").assert_outcomes(passed=5)
    listed = (suite.path / "expensive.txt").read_text()
    assert "test_gone" not in listed and "test_suite.py::test_slow  # " in listed, listed


def test_files_run_largest_measured_cost_first(suite):
    """Two workers get whole files in collection order, so the files come largest first (the
    listed seconds, 1 s for each test not listed), each file's tests in their own order."""
    suite.makepyfile(test_small="def test_one():\n    pass\n",
                     test_large="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    (suite.path / "expensive.txt").write_text(
        "# measured\ntest_small.py::test_one  # 9.0 s\n")
    order = [line.split("::")[0] + "::" + line.split("::")[1]
             for line in run(suite, "--collect-only", "-q").stdout.lines if "::" in line]
    assert order == ["test_small.py::test_one", "test_suite.py::test_starts_a_process_unmarked",
                     "test_suite.py::test_starts_a_process_marked", "test_suite.py::test_slow",
                     "test_suite.py::test_quick", "test_suite.py::test_pays_the_module_fixture",
                     "test_large.py::test_a",
                     "test_large.py::test_b"], order
