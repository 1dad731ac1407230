"""The evaluator on JAX: train/loop/evaluator.py's `Evaluator` (its settings, steps and result) with
each host loop one compiled call, as train/loop/jax_train_step.py's loop is for training: a
`jax.jit` of a `lax.scan` over the loop's segments, a pure function of the weights, the key/value
ring
and the loop's global batches split along the mesh's batch axis (tfxl/tpu/jax_mesh.py).

The ring is carried through the scan and from one loop to the next (donated: no copy of it is
made); the per-segment sums stay on the device until the loop ends and come to the host in one
transfer, [n] of each rather than their float32 total: the host adds them in float64 in segment
order, so the result is that of reading each segment's sums, whatever steps_per_loop is.

Shape glossary: n segments per loop, B global batch, T segment length.
"""

import numpy as np

from tfxl.train.loop.evaluator import Evaluator


class JaxEvaluator(Evaluator):
    """`Evaluator` on JAX; `strategy` is a `tfxl.tpu.jax_mesh.JaxDistribution`. Each pass
    starts from an empty ring and the position keys of the current weights, computed once."""

    def __init__(self, model, strategy, data, global_batch, steps_per_loop=100, progress=None):
        super().__init__(model, strategy, data, global_batch, steps_per_loop, False, progress)

    def _loop_fn(self, trainable, non_trainable, memory, position_keys, batches, same_length):
        """Scores the n segments of `batches` ({key: [n, B, ...]}) in order on `memory`;
        returns (the memory after them, [n] sums of NLL, [n] target tokens, and the same per
        position of the segment, [n, T] each)."""
        import jax
        from keras import ops

        def one_segment(memory, batch):
            (nll, memory), _ = self.model.stateless_call(
                trainable, non_trainable, batch["inputs"], memory, reset=batch["reset"],
                targets=batch["targets"], training=False, same_length=same_length,
                position_keys=position_keys)
            mask = ops.cast(batch["target_mask"], "float32")
            nll = ops.cast(nll, "float32") * mask
            return memory, (ops.sum(nll), ops.sum(mask), ops.sum(nll, axis=0),
                            ops.sum(mask, axis=0))

        memory, sums = jax.lax.scan(one_segment, memory, batches)
        return (memory, *sums)

    def _compiled_loop(self, s, memory):
        """The jitted loop for settings `s`, made once per settings. Its memory leaves each call
        laid out as it came in (split along the batch), so the next call takes it as it is.

        The loop's length is the argument's: the last loop of a pass, shorter than
        steps_per_loop, compiles once more (jit's cache then holds it for every later pass of
        these settings and split) rather than being padded to steps_per_loop with masked
        segments, each of which would cost the forward pass of a real one at every pass (up to
        steps_per_loop - 1 of them: a pass of fewer segments than steps_per_loop would run
        them all), where a compile costs once."""
        key = (s["batch_size"], s["tgt_len"], s["mem_len"], s["same_length"])
        if key not in self._loops:
            import functools

            import jax
            layouts = jax.tree_util.tree_map(lambda array: array.sharding, memory)
            replicated = self.strategy.replicated()
            self._loops[key] = jax.jit(
                functools.partial(self._loop_fn, same_length=s["same_length"]),
                donate_argnums=(2,), out_shardings=(layouts, *[replicated] * 4))
        return self._loops[key]

    def eval_begin(self, s, *, by_position=False):
        del by_position  # the compiled loop returns the per-position sums always ([n, T])
        import jax
        strategy, model = self.strategy, self.model
        memory = jax.tree_util.tree_map(
            strategy.split_along_batch,
            model.init_key_value_ring(s["batch_size"], s["tgt_len"], s["mem_len"]))
        position_keys = model.position_keys(s["mem_len"] + s["tgt_len"], s["clamp_len"])
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        compiled = self._compiled_loop(s, memory)
        state = {"memory": memory}

        def loop(iterator, n):
            local = [next(iterator) for _ in range(int(n))]
            batches = {key: strategy.global_array(np.stack([b[key] for b in local]),
                                                  batch_axis=1)
                       for key in local[0]}
            state["memory"], nll_sums, tokens, nll_by_position, tokens_by_position = compiled(
                trainable, non_trainable, state["memory"], position_keys, batches)
            total = count = 0.0
            for segment_nll, segment_tokens in zip(np.asarray(nll_sums).tolist(),
                                                   np.asarray(tokens).tolist()):
                total, count = total + segment_nll, count + segment_tokens
            return (np.float64(total), np.float64(count),
                    np.asarray(nll_by_position, np.float64).sum(axis=0),
                    np.asarray(tokens_by_position, np.float64).sum(axis=0))

        return loop

    def batches(self, split, s):
        return self.data.dataset(split, s["batch_size"], False, s["tgt_len"]).as_numpy_iterator()
