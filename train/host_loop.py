"""The end of a host loop, the same on both backends: the per-step losses, gradient norms and
learning rates a loop returns (train/train_step.py's `TrainStep` on TensorFlow,
train/jax_train_step.py's `JaxTrainStep` on JAX), and `TrainingDiverged` at a non-finite loss.

Imports no TensorFlow: the JAX step runs where TensorFlow is not installed.
"""

import keras
import numpy as np


class TrainingDiverged(RuntimeError):
    """A non-finite loss; the message names the step. The last good checkpoint is kept."""


def loop_outputs(schedule, first_step, losses, norms):
    """A host loop's outputs from its per-step losses and gradient norms (numpy), with the
    schedule's rate at each step (what the train log and TensorBoard record);
    TrainingDiverged names the first step whose loss is not finite."""
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
        raise TrainingDiverged(f"non-finite loss {losses[bad[0]]} at step "
                               f"{first_step + bad[0] + 1}")
    rates = np.array([float(keras.ops.convert_to_numpy(schedule(first_step + i)))
                      for i in range(len(losses))])
    return {"loss": losses, "grad_norm": norms, "learning_rate": rates}
