import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
