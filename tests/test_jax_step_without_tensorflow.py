"""tfxl-train's JAX step where TensorFlow is not installed (the GPU machine of
benchmarks/accelerator_bench.py): `JaxTrainStep` and `resolve_distribution` import and train the
language model's task from numpy batches, in a process where TensorFlow cannot be imported.
"""

import json
import os
import subprocess
import sys

import pytest

from backends import JAX_XLA_FLAGS, WITHOUT_TENSORFLOW

pytestmark = [pytest.mark.large, pytest.mark.subprocess]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The child: two host loops of two steps on a mesh of two CPU devices.
TRAIN_WITHOUT_TENSORFLOW = WITHOUT_TENSORFLOW + """
import json
import keras
import numpy as np
from tfxl.config import TransfoXLConfig
from tfxl.tpu.jax_mesh import resolve_distribution
from tfxl.train import backends
from tfxl.train.tasks.language_model import LanguageModelTask, build_model
from tfxl.train.loop.optimization import OptimizerParams

VOCAB, T, B = 23, 4, 4


class NumpyBatches:
    \"\"\"The train split as JaxTrainStep reads it (`dataset(...).as_numpy_iterator()`), from
    numpy: the batches tfxl's pipeline gives, random tokens.\"\"\"

    def __init__(self):
        self.requests = []

    def dataset(self, split, batch, training, skip_batches=0):
        self.requests.append([split, batch, training, skip_batches])
        rng = np.random.default_rng(skip_batches)

        def batches():
            while True:
                tokens = rng.integers(0, VOCAB, (batch, T + 1), dtype=np.int32)
                yield {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                       "target_mask": np.ones((batch, T), np.int32),
                       "reset": np.zeros((batch,), np.int32)}
        return type("Batches", (), {"as_numpy_iterator": staticmethod(batches)})()


keras.config.set_dtype_policy("mixed_bfloat16")
keras.utils.set_random_seed(0)
config = TransfoXLConfig(vocab_size=VOCAB, n_layer=2, d_model=16, n_head=2, d_head=6,
                         d_inner=24, dropout=0.1, dropatt=0.0, tgt_len=T, mem_len=T)
strategy = resolve_distribution("data_parallel")
task = LanguageModelTask(config, data_dir="unused")
data = NumpyBatches()
step = backends.for_strategy(strategy).train_step(
    task, build_model(config, strategy), data=data, global_batch=B,
    optimizer=OptimizerParams(learning_rate=1e-3), mixed_precision="mixed_bfloat16")
loops = [step.train(2) for _ in range(2)]
after_two_loops = step.step
step.rewind_input()
loops.append(step.train(1))
print("RESULT " + json.dumps({
    "devices": strategy.num_replicas_in_sync,
    "losses": [float(x) for loop in loops for x in loop["loss"]],
    "rates": [float(x) for loop in loops for x in loop["learning_rate"]],
    "steps": [after_two_loops, step.step],
    "requests": data.requests,
    "memory_devices": len(step.memory.value.states[0].sharding.device_set),
    "checkpoint_made": "checkpointed" in vars(step.memory),
    "tensorflow_loaded": [name for name, module in sys.modules.items()
                          if name.split(".")[0] == "tensorflow" and module is not None],
}))
"""


def test_the_jax_step_trains_from_numpy_where_tensorflow_is_not_installed():
    """Two host loops of `JaxTrainStep.train(2)` under `resolve_distribution("data_parallel")`
    on two devices, bf16 mixed: finite losses, step 4, the input read once (then again from step
    4 after `rewind_input`), the memory split over both devices, and no TensorFlow (not even the
    memory's checkpoint copies, which a checkpoint makes when it first asks)."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{JAX_XLA_FLAGS} --xla_force_host_platform_device_count=2",
           "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", TRAIN_WITHOUT_TENSORFLOW], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines()
                             if line.startswith("RESULT "))[len("RESULT "):])
    assert result["devices"] == 2 and result["memory_devices"] == 2
    assert result["steps"] == [4, 5]
    assert len(result["losses"]) == 5
    assert all(0 < loss < 10 for loss in result["losses"]), result["losses"]
    assert result["rates"][0] > 0
    assert result["requests"] == [["train", 4, True, 0], ["train", 4, True, 4]]
    assert not result["checkpoint_made"]
    assert result["tensorflow_loaded"] == []
