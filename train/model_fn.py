"""model_fn: the model, its optimizer and the per-replica train and eval steps.

Shape glossary: B global batch, b per-replica batch, T segment length, R replicas, M memory
length, K = M + T keys.

Everything here runs in replica context (inside `strategy.run`); the host loop lives in loop.py.
"""

import dataclasses

import keras
import tensorflow as tf

from tfxl.layers.memory import per_layer
from tfxl.models import TransfoXLLM
from train.memory_state import CheckpointedReplicaMemory, ReplicaMemory, ReplicaPositionKeys


@dataclasses.dataclass
class OptimizerParams:
    learning_rate: float = 2.5e-4
    warmup_steps: int = 0
    min_lr_ratio: float = 0.004
    train_steps: int = 1000
    clip: float = 0.25
    optimizer: str = "adam"
    weight_decay: float = 0.0


def learning_rate_schedule(p: OptimizerParams):
    """Linear warm-up to the peak, then cosine decay to peak * min_lr_ratio (the paper's)."""
    decay_steps = max(p.train_steps - p.warmup_steps, 1)
    if p.warmup_steps > 0:
        return keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps, alpha=p.min_lr_ratio, warmup_target=p.learning_rate,
            warmup_steps=p.warmup_steps)
    return keras.optimizers.schedules.CosineDecay(p.learning_rate, decay_steps,
                                                  alpha=p.min_lr_ratio)


def make_optimizer(p: OptimizerParams, mixed_precision: str):
    schedule = learning_rate_schedule(p)
    if p.optimizer == "adam":
        optimizer = keras.optimizers.Adam(schedule)
    elif p.optimizer == "adamw":
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=p.weight_decay)
    elif p.optimizer == "lamb":
        optimizer = keras.optimizers.Lamb(schedule, weight_decay=p.weight_decay or None)
    else:
        raise ValueError(f"--optimizer={p.optimizer!r}: choose adam, adamw or lamb")
    if mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer, schedule


class ModelFn:
    """Builds model, optimizer and training memory under `strategy`, makes evaluation state;
    defines the replica steps."""

    def __init__(self, config, strategy, global_batch, opt: OptimizerParams,
                 mixed_precision="float32", jit_compile=False):
        if global_batch % strategy.num_replicas_in_sync:
            raise ValueError(f"--train_batch_size={global_batch} is not divisible by the "
                             f"{strategy.num_replicas_in_sync} replicas")
        self.config, self.strategy = config, strategy
        self.global_batch = global_batch
        self.per_replica_batch = global_batch // strategy.num_replicas_in_sync
        self.clip = opt.clip
        with strategy.scope():
            self.model = TransfoXLLM(config, name="transfo_xl_lm")
            self.model.build((None, config.tgt_len))
            self.optimizer, self.schedule = make_optimizer(opt, mixed_precision)
            self.optimizer.build(self.model.trainable_variables)
        self.loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        self.memory = CheckpointedReplicaMemory(
            strategy, self.model.init_memory(self.per_replica_batch), "train_memory")
        self._forward_backward = (tf.function(self._forward_backward_fn, jit_compile=True)
                                  if jit_compile else self._forward_backward_fn)
        # One trace per (memory length, segment length, same_length): shapes stay static for XLA.
        self._eval_forward = (tf.function(self._eval_forward_fn, jit_compile=True)
                              if jit_compile else self._eval_forward_fn)

    # -- training -----------------------------------------------------------------------------
    def _forward_backward_fn(self, features, memory, global_tokens):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            nll, new_memory = self.model(features["inputs"], memory, reset=features["reset"],
                                         targets=features["targets"], training=True)
            mask = tf.cast(features["target_mask"], nll.dtype)
            # This replica's share of the global token-weighted mean (padding excluded): summing
            # over replicas gives the mean over every real target of the global batch.
            loss = tf.reduce_sum(nll * mask) / global_tokens
            scaled = self.optimizer.scale_loss(loss) if self.loss_scaled else loss
        grads = tape.gradient(scaled, variables)
        return loss, [tf.convert_to_tensor(g) for g in grads], new_memory

    def train_step(self, features):
        """One optimisation step on this replica's rows; returns the global (loss, grad norm)."""
        context = tf.distribute.get_replica_context()
        tokens = tf.reduce_sum(tf.cast(features["target_mask"], tf.float32))
        global_tokens = tf.maximum(context.all_reduce(tf.distribute.ReduceOp.SUM, tokens), 1.0)
        loss, grads, new_memory = self._forward_backward(features, self.memory.read(),
                                                         global_tokens)
        # Keras optimizers clip before their own all-reduce, i.e. per replica. Global-norm
        # clipping needs the summed gradient, so sum here, clip, and hand the optimizer 1/R of it
        # (its all-reduce sums the R identical copies back).
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        if self.loss_scaled:
            scale = tf.cast(self.optimizer.dynamic_scale, tf.float32)
            grads = [g / scale for g in grads]
        grads, grad_norm = tf.clip_by_global_norm(grads, self.clip)
        if self.loss_scaled:
            grads = [g * scale for g in grads]  # the LossScaleOptimizer unscales (and skips inf)
        replicas = float(context.num_replicas_in_sync)
        self.optimizer.apply([g / replicas for g in grads], self.model.trainable_variables)
        self.memory.write(new_memory)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, loss), grad_norm

    # -- evaluation ---------------------------------------------------------------------------
    # Evaluation reads a key/value memory: with fixed weights it is exactly what the training
    # memory would be projected to, and each step projects only its T new rows. The position keys
    # (W_k,R R for K = M + T) are computed once per pass, not per step (see ReplicaPositionKeys).
    def eval_memory(self, global_batch, mem_len):
        """An empty key/value memory of `mem_len` slots for `global_batch` rows (cross-replica)."""
        per_replica = global_batch // self.strategy.num_replicas_in_sync
        return ReplicaMemory(
            self.strategy, per_layer(self.model.init_key_value_memory(per_replica, mem_len)),
            f"eval_memory_{global_batch}_{mem_len}")

    def eval_position_keys(self, key_length, clamp_len):
        """Per-replica position keys for K = `key_length` (cross-replica; `refresh()` them)."""
        return ReplicaPositionKeys(self.strategy, self.model, key_length, clamp_len,
                                   f"eval_position_keys_{key_length}_{clamp_len}")

    def _eval_forward_fn(self, features, memory, position_keys, same_length):
        nll, new_memory = self.model(features["inputs"], memory, reset=features["reset"],
                                     targets=features["targets"], training=False,
                                     same_length=same_length, position_keys=position_keys)
        mask = tf.cast(features["target_mask"], tf.float32)
        return tf.reduce_sum(nll * mask), tf.reduce_sum(mask), new_memory

    def eval_step(self, features, memory: ReplicaMemory, position_keys: ReplicaPositionKeys,
                  same_length):
        """Scores this replica's rows; returns the global (sum of NLL, number of target tokens).

        memory: a key/value `eval_memory`; position_keys: `eval_position_keys` for M + T, already
        refreshed for this pass (they carry the clamp_len).
        """
        context = tf.distribute.get_replica_context()
        nll_sum, count, new_memory = self._eval_forward(features, memory.read(),
                                                        position_keys.read(), same_length)
        memory.write(new_memory)
        return (context.all_reduce(tf.distribute.ReduceOp.SUM, nll_sum),
                context.all_reduce(tf.distribute.ReduceOp.SUM, count))
