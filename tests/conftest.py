import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The same kernels on every x86 host, for this process and every process a test starts:
# TensorFlow turns oneDNN on by itself only where the CPU has AVX-512 (not on an AVX2-only AMD
# EPYC, the CI machine), and oneDNN's kernels round differently. Export TF_ENABLE_ONEDNN_OPTS=1 to
# run the suite with them.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

# TensorFlow's native start-up lines ("Could not find cuda drivers", "failed call to cuInit: ...
# (303)", absl's "WARNING: All log messages before absl::InitializeLog()") ignore
# TF_CPP_MIN_LOG_LEVEL and would follow every pass of `make test`: each test process's stderr goes
# through the tools' own filter (tfxl/cli/quiet.py), which passes everything else. Before
# TensorFlow loads; TFXL_TEST_NATIVE_LOGS=1 keeps them.
if os.environ.get("TFXL_TEST_NATIVE_LOGS") != "1":
    from tfxl.cli.quiet import hide_native_logs

    hide_native_logs()

import keras
import numpy as np
import pytest
import tensorflow as tf

from backends import JAX_XLA_FLAGS
from gcs_emulator import gcs  # noqa: F401  (the fixture, for every test file)

# Read when JAX creates its CPU client, at the first computation: after this.
if keras.backend.backend() == "jax":
    os.environ.setdefault("XLA_FLAGS", JAX_XLA_FLAGS)

# Two logical CPU devices in every test process, so MirroredStrategy tests can run two replicas.
# This must happen before TensorFlow initialises its devices, hence at conftest import.
try:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
except RuntimeError:  # devices already initialised by an earlier import: keep what exists
    pass


def pytest_collection_modifyitems(config, items):
    """On a backend other than TensorFlow (`KERAS_BACKEND=jax make test`'s second run), only the
    modules marked `every_backend` run, without their tests marked `tensorflow_only`."""
    if keras.backend.backend() == "tensorflow":
        return
    keep = [item for item in items if item.get_closest_marker("every_backend")]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep
    skip = pytest.mark.skip(reason=f"needs TensorFlow; Keras runs on {keras.backend.backend()}")
    for item in keep:
        if item.get_closest_marker("tensorflow_only"):
            item.add_marker(skip)


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


@pytest.fixture(scope="session")
def gcs_worker(gcs):  # noqa: F811  (gcs: the fixture imported above)
    """One process in the GCS emulator's namespace that runs gs:// tools in process
    (factories.GcsWorker) for every test of this session that uses gs://: one TensorFlow start.
    Each request names its working directory."""
    from factories import GcsWorker
    with GcsWorker(gcs) as worker:
        yield worker
