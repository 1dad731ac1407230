"""The evaluator on JAX: train/evaluator.py's `Evaluator` (its settings, steps and result), its
step one jitted pure function of the weights, the key/value ring and a global batch split along
the mesh's batch axis (tfxl/tpu/jax_mesh.py)."""

import numpy as np

from tfxl.train.evaluator import Evaluator


class JaxEvaluator(Evaluator):
    """`Evaluator` on JAX; `strategy` is a `tfxl.tpu.jax_mesh.JaxDistribution`. Each pass
    starts from an empty ring and the position keys of the current weights, computed once."""

    def __init__(self, model, strategy, data, global_batch, steps_per_loop=100, progress=None):
        import jax
        super().__init__(model, strategy, data, global_batch, steps_per_loop, False, progress)
        self._step = jax.jit(self._step_fn, static_argnums=(5,), donate_argnums=(2,))

    def _step_fn(self, trainable, non_trainable, memory, position_keys, batch, same_length):
        from keras import ops
        (nll, new_memory), _ = self.model.stateless_call(
            trainable, non_trainable, batch["inputs"], memory, reset=batch["reset"],
            targets=batch["targets"], training=False, same_length=same_length,
            position_keys=position_keys)
        mask = ops.cast(batch["target_mask"], "float32")
        return ops.sum(ops.cast(nll, "float32") * mask), ops.sum(mask), new_memory

    def eval_begin(self, s):
        import jax
        strategy, model = self.strategy, self.model
        memory = jax.tree_util.tree_map(
            strategy.split_along_batch,
            model.init_key_value_ring(s["batch_size"], s["tgt_len"], s["mem_len"]))
        position_keys = model.position_keys(s["mem_len"] + s["tgt_len"], s["clamp_len"])
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        state = {"memory": memory}

        def loop(iterator, n):
            total = count = 0.0
            for _ in range(int(n)):
                local = next(iterator)
                batch = {key: strategy.global_array(value) for key, value in local.items()}
                nll_sum, tokens, state["memory"] = self._step(
                    trainable, non_trainable, state["memory"], position_keys, batch,
                    s["same_length"])
                total, count = total + float(nll_sum), count + float(tokens)
            return np.float64(total), np.float64(count)

        return loop

    def batches(self, split, s):
        return self.data.dataset(split, s["batch_size"], False, s["tgt_len"]).as_numpy_iterator()
