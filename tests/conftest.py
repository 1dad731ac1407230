import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The same kernels on every x86 host, for this process and every process a test starts:
# TensorFlow turns oneDNN on by itself only where the CPU has AVX-512 (not on an AVX2-only AMD
# EPYC, the CI machine), and oneDNN's kernels round differently. Export TF_ENABLE_ONEDNN_OPTS=1 to
# run the suite with them.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import subprocess

import keras
import numpy as np
import pytest
import tensorflow as tf

from gcs_emulator import gcs  # noqa: F401  (the fixture, for every test file)

# Two logical CPU devices in every test process, so MirroredStrategy tests can run two replicas.
# This must happen before TensorFlow initialises its devices, hence at conftest import.
try:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
except RuntimeError:  # devices already initialised by an earlier import: keep what exists
    pass


@pytest.fixture(autouse=True)
def _float32_and_seeded():
    """Every test starts in float32 with fixed seeds, whatever the previous test set."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="session")
def mirrored():
    """One MirroredStrategy over the two logical CPUs for the whole session: several strategy
    objects in one process would share collective instance keys across their programs."""
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


# -- the markers, kept honest (BUILD.md, "Tests") -------------------------------------------------
# `subprocess`: the test starts another process. Checked as the suite runs: a test that starts one
# without the mark is listed at the end of the run.
# `expensive`: the test measured over EXPENSIVE_SECONDS (setup, call and teardown) in a whole
# `make test`; the list is EXPENSIVE_LIST, checked in, and the run names every test whose
# measurement no longer agrees with it. `--update-expensive` rewrites the list from the run.

EXPENSIVE_SECONDS = 5.0
EXPENSIVE_LIST = os.path.join(os.path.dirname(__file__), "expensive_tests.txt")


def pytest_addoption(parser):
    parser.addoption("--update-expensive", action="store_true",
                     help=f"rewrite {os.path.basename(EXPENSIVE_LIST)} from this run's durations "
                          "(run the whole suite as `make test` does)")


def _expensive_ids():
    with open(EXPENSIVE_LIST) as f:
        return {line.split("#")[0].strip() for line in f} - {""}


def pytest_collection_modifyitems(config, items):
    expensive = _expensive_ids()
    for item in items:
        if item.nodeid in expensive:
            item.add_marker(pytest.mark.expensive)


@pytest.fixture(autouse=True)
def _processes_only_where_marked(request, monkeypatch):
    """Notes every process an unmarked test starts (reported at the end of the run)."""
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
    """On the process that reports (the xdist controller, or the only one): each test's seconds
    and the processes of unmarked tests."""

    def __init__(self):
        self.seconds, self.unmarked, self.marked_expensive = {}, {}, set()

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if "expensive" in report.keywords:
            self.marked_expensive.add(report.nodeid)
        for name, value in report.user_properties:
            if name == "unmarked_process":
                self.unmarked.setdefault(report.nodeid, value)

    def pytest_terminal_summary(self, terminalreporter, config):
        write = terminalreporter.write_line
        if self.unmarked:
            terminalreporter.section("tests that start a process without the subprocess mark")
            for nodeid, args in sorted(self.unmarked.items()):
                write(f"{nodeid}: {args}")
        over = {n for n, s in self.seconds.items() if s > EXPENSIVE_SECONDS}
        if config.getoption("update_expensive"):
            with open(EXPENSIVE_LIST, "w") as f:
                f.write(f"# Tests measured over {EXPENSIVE_SECONDS:g} s (setup + call + "
                        "teardown) in a whole `make test`, marked `expensive` by conftest.py.\n"
                        "# Rewritten by `make test PYTEST_ARGS=--update-expensive`.\n")
                for nodeid in sorted(over):
                    f.write(f"{nodeid}  # {self.seconds[nodeid]:.1f} s\n")
            write(f"{EXPENSIVE_LIST}: {len(over)} expensive tests written")
            return
        unlisted = sorted(over - self.marked_expensive)
        if unlisted:
            terminalreporter.section(f"tests over {EXPENSIVE_SECONDS:g} s not marked expensive")
            for nodeid in unlisted:
                write(f"{nodeid}: {self.seconds[nodeid]:.1f} s")
            write(f"(measured under this run's load; `make test PYTEST_ARGS=--update-expensive` "
                  f"rewrites {os.path.basename(EXPENSIVE_LIST)})")


def pytest_configure(config):
    config.pluginmanager.register(_MarkerCheck(), "tfxl_marker_check")
