"""The optimizer and learning-rate schedule of training.

Gradients cross the replicas once per step: the trainer sums them itself, because global-norm
clipping needs the norm of the summed gradient, and Keras' TensorFlow optimizers, which would sum
them again inside `apply` (`_all_reduce_sum_gradients`, called from `_backend_update_step`), take
them as they are (`AllReducedGradients`). On a pod that sum is the step's largest collective.
"""

import dataclasses
from typing import Optional

import keras


@dataclasses.dataclass
class OptimizerParams:
    learning_rate: float = 2.5e-4
    warmup_steps: int = 0
    min_lr_ratio: float = 0.004
    train_steps: int = 1000
    clip: float = 0.25
    optimizer: str = "adam"
    weight_decay: float = 0.0
    # The schedule's length; None: train_steps. Past it the rate stays at its final value
    # (a run extended beyond its recorded schedule: train/records/run_record.py).
    schedule_steps: Optional[int] = None


def learning_rate_schedule(p: OptimizerParams):
    """Linear warm-up to the peak, then cosine decay to peak * min_lr_ratio (the paper's) at
    `schedule_steps` (default train_steps), where it stays (CosineDecay clamps the step)."""
    decay_steps = max((p.schedule_steps or p.train_steps) - p.warmup_steps, 1)
    if p.warmup_steps > 0:
        return keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps, alpha=p.min_lr_ratio, warmup_target=p.learning_rate,
            warmup_steps=p.warmup_steps)
    return keras.optimizers.schedules.CosineDecay(p.learning_rate, decay_steps,
                                                  alpha=p.min_lr_ratio)


class AllReducedGradients:
    """For Keras optimizers whose gradients the caller has already summed over the replicas.

    Keras' TensorFlow backend sums the gradients across replicas in exactly one place,
    `_all_reduce_sum_gradients`; here it passes them through. Everything else (`apply`, the loss
    scale, weight decay, the per-variable `distribution.extended.update`) is Keras' own.
    """

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)


class Adam(AllReducedGradients, keras.optimizers.Adam):
    pass


class AdamW(AllReducedGradients, keras.optimizers.AdamW):
    pass


class Lamb(AllReducedGradients, keras.optimizers.Lamb):
    pass


def make_optimizer(p: OptimizerParams, mixed_precision: str):
    """(optimizer, schedule); the optimizer expects gradients already summed over replicas."""
    schedule = learning_rate_schedule(p)
    if p.optimizer == "adam":
        optimizer = Adam(schedule)
    elif p.optimizer == "adamw":
        optimizer = AdamW(schedule, weight_decay=p.weight_decay)
    elif p.optimizer == "lamb":
        optimizer = Lamb(schedule, weight_decay=p.weight_decay or None)
    else:
        raise ValueError(f"--optimizer={p.optimizer!r}: choose adam, adamw or lamb")
    if mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer, schedule


def clip_by_global_norm(grads, clip_norm):
    """(`grads` scaled so that their global norm is at most `clip_norm`, their global norm):
    tf.clip_by_global_norm's rule in keras.ops, so that the steps of both backends clip alike.

    The norm is the square root of the sum of every gradient's squares, in float32; each
    gradient is scaled by `clip_norm * min(1 / norm, 1 / clip_norm)` (1 under the clip, also at a
    norm of 0). A norm that is not finite (an inf or NaN gradient, or squares past float32's
    range) makes every gradient NaN, as TensorFlow's does: the step then fails visibly (a NaN
    loss, or the float16 loss scale skipping it) instead of silently applying a zero update.
    None gradients stay None.
    """
    ops = keras.ops
    present = [ops.cast(g, "float32") for g in grads if g is not None]
    norm = ops.sqrt(ops.sum(ops.stack([ops.sum(ops.square(g)) for g in present])))
    clip = ops.convert_to_tensor(clip_norm, "float32")
    scale = clip * ops.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)  # NaN where not finite
    return [None if g is None else g * ops.cast(scale, g.dtype) for g in grads], norm
