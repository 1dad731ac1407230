"""The markers `subprocess` and `expensive`, kept true as the suite runs (BUILD.md, "Tests").

tests/conftest.py imports these hooks and the fixture; tests/test_markers.py runs them on a
small suite of its own.

`subprocess`: the test starts another process. A test that starts one without the mark is
listed at the end of the run.
`expensive`: the test's call took over `expensive_seconds` (its fixtures' setup and teardown not
counted: a module fixture's cost lands on whichever of its tests runs first) in a whole run
(`make test-all`), or in a run of the tests not marked expensive (`make test`). The tests are
listed, with their seconds, in the `expensive_list` file (both are pytest ini options:
setup.cfg), which is read here to mark them. Each run lists the tests over the threshold that the
file lacks. `--update-expensive` rewrites the file from a whole run; after a run that `-m` or
`-k` filtered, it adds that run's tests over the threshold and keeps what is listed. The second
finds what a whole run hides: a cost paid by the first call of its kind in a process (a first
trace or compile, a lazy import), which `make test`, without the expensive test that paid it
there, hands to another test.
"""

import os
import subprocess

import pytest

__all__ = ["pytest_addoption", "pytest_configure", "pytest_collection_modifyitems",
           "_processes_only_where_marked"]


def pytest_addoption(parser):
    parser.addini("expensive_list", "file of the tests marked expensive (one node id a line)",
                  default="tests/expensive_tests.txt")
    parser.addini("expensive_seconds", "a test over this many seconds is expensive",
                  default="3")
    parser.addoption("--update-expensive", action="store_true",
                     help="update the expensive_list file from this run's durations: "
                          "rewritten from a whole run (make test-all), added to by a run that "
                          "-m filters (make test)")


def _list_path(config):
    return os.path.join(str(config.rootpath), config.getini("expensive_list"))


def _threshold(config):
    return float(config.getini("expensive_seconds"))


def _listed_seconds(config):
    """{node id: measured seconds} of the tests in the expensive_list file."""
    path, listed = _list_path(config), {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                nodeid, _, comment = line.partition("#")
                if nodeid.strip():
                    # without its seconds: at least the threshold it was listed for
                    listed[nodeid.strip()] = float((comment.split() or [_threshold(config)])[0])
    return listed


def pytest_collection_modifyitems(config, items):
    listed = _listed_seconds(config)
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.expensive)
    # Files in order of their measured cost, largest first (each test not listed counted as
    # 1 s), tests within a file in their own order. `make test` hands whole files to two workers
    # in this order (`--dist loadfile --no-loadscope-reorder`): largest first is what lets them
    # finish together instead of one worker running a large file alone at the end.
    seconds = {}
    for item in items:
        seconds[item.path] = seconds.get(item.path, 0.0) + listed.get(item.nodeid, 1.0)
    items.sort(key=lambda item: -seconds[item.path])  # stable: in-file order kept


@pytest.fixture(autouse=True)
def _processes_only_where_marked(request, monkeypatch):
    """Notes every process an unmarked test starts (listed at the end of the run)."""
    if request.node.get_closest_marker("subprocess"):
        yield
        return
    popen_init = subprocess.Popen.__init__

    def noted(self, args, *rest, **kwargs):
        request.node.user_properties.append(("unmarked_process", str(args)[:200]))
        popen_init(self, args, *rest, **kwargs)
    monkeypatch.setattr(subprocess.Popen, "__init__", noted)
    yield


class _MarkerCheck:
    """In the process that reports (the xdist controller, or the only one): each test's seconds
    and the processes that unmarked tests started."""

    def __init__(self, config):
        self.config = config
        self.seconds, self.unmarked, self.marked_expensive = {}, {}, set()

    def pytest_runtest_logreport(self, report):
        # The call only: a module fixture's setup lands on whichever of its tests runs first, so
        # listing that test would hand the cost to the next one, run after run.
        if report.when == "call":
            self.seconds[report.nodeid] = report.duration
        if "expensive" in report.keywords:
            self.marked_expensive.add(report.nodeid)
        for name, value in report.user_properties:
            if name == "unmarked_process":
                self.unmarked.setdefault(report.nodeid, value)

    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        if self.unmarked:
            terminalreporter.section("tests that start a process without the subprocess mark")
            for nodeid, args in sorted(self.unmarked.items()):
                write(f"{nodeid}: {args}")
        threshold, path = _threshold(self.config), _list_path(self.config)
        if threshold == float("inf"):  # the PyTorch pass: no list of its own
            return
        over = {n: s for n, s in self.seconds.items() if s > threshold}
        if self.config.getoption("update_expensive"):
            filtered = bool(self.config.getoption("markexpr") or self.config.getoption("keyword"))
            listed = {**_listed_seconds(self.config), **over} if filtered else over
            with open(path, "w") as f:
                f.write(f"# Tests whose call took over {threshold:g} s (fixtures not counted) in a "
                        "whole run, or in a run without the expensive ones;\n# "
                        "tests/marker_check.py marks them expensive. Rewritten by `make "
                        "test-all PYTEST_ARGS=--update-expensive`,\n# then added to by "
                        "`make test PYTEST_ARGS=--update-expensive` (BUILD.md \"Tests\").\n")
                for nodeid in sorted(listed):
                    f.write(f"{nodeid}  # {listed[nodeid]:.1f} s\n")
            write(f"{path}: {len(listed)} expensive tests written")
            return
        unlisted = sorted(set(over) - self.marked_expensive)
        if unlisted:
            terminalreporter.section(f"tests over {threshold:g} s not marked expensive")
            for nodeid in unlisted:
                write(f"{nodeid}: {self.seconds[nodeid]:.1f} s")
            write(f"(measured under this run's load; `--update-expensive` in PYTEST_ARGS "
                  f"updates {path})")


def pytest_configure(config):
    config.pluginmanager.register(_MarkerCheck(config), "tfxl_marker_check")
