"""The evaluator: token-weighted loss, bpc or perplexity of a model over a split, with memory.

In the manner of Orbit's StandardEvaluator: `evaluate` runs `eval_begin` (an empty key/value
memory, the position keys of the current weights), the replica `eval_step` in host loops of
`steps_per_loop` steps inside one `tf.function`, and `eval_end` (the result). It needs the model
only: no optimizer, no training memory. A progress bar with rate and ETA (`EvalProgress`) shows
on stderr when that is a terminal.

Shape glossary: B global batch, b per-replica batch, T segment length, M memory length,
K = M + T keys.
"""

import contextlib
import math
import sys

import keras
import numpy as np
import tensorflow as tf

from tfxl.cli.quiet import stream_is_terminal
from tfxl.train.loop.memory_state import ReplicaMemory, ReplicaPositionKeys

LOG2 = math.log(2.0)


def metric_name(manifest):
    return "bpc" if manifest.get("is_character_level", False) else "ppl"


def metric_value(name, mean_nll):
    return mean_nll / LOG2 if name == "bpc" else float(np.exp(min(mean_nll, 50.0)))


class EvalProgress:
    """A keras Progbar (rate and ETA) over an evaluation pass, written to stderr (stdout carries
    tfxl-eval's result).

    Args:
      visible: show it; None: only when stderr is a terminal (quiet in logs and pipes).
    """

    def __init__(self, visible=None, stream=None):
        self.stream = stream or sys.stderr
        # Not stream.isatty(): under the tools' native-log filter stderr is a pipe.
        self.visible = stream_is_terminal(self.stream) if visible is None else bool(visible)
        self._bar = None

    def begin(self, steps, split):
        if self.visible:
            with contextlib.redirect_stdout(self.stream):
                print(f"evaluating {split}: {steps} steps")
                self._bar = keras.utils.Progbar(steps, unit_name="step")

    def update(self, done):
        if self._bar is not None:
            with contextlib.redirect_stdout(self.stream):
                self._bar.update(done)

    def end(self):
        self._bar = None


class Evaluator:
    """Evaluates `model` (built under `strategy`) on the splits of `data`.

    Args:
      model: a built language model (`tfxl.models.build_language_model`: Transformer-XL or a
        baseline, each giving its own evaluation memory, `init_key_value_ring`). strategy: its
        strategy.
      data: a `tfxl.train.tasks.datasets.DistributedData`.
      global_batch: the default batch (B, divisible by the replicas).
      steps_per_loop: steps per `tf.function` call.
      jit_compile: XLA-compile each replica's forward pass (one trace per M, T, same_length).
      progress: an `EvalProgress`; None: quiet.
    """

    def __init__(self, model, strategy, data, global_batch, steps_per_loop=100,
                 jit_compile=False, progress=None):
        self.model, self.strategy, self.data = model, strategy, data
        self.global_batch, self.steps_per_loop = global_batch, steps_per_loop
        self.metric = metric_name(data.manifest)
        self.progress = progress or EvalProgress(visible=False)
        self._forward = (tf.function(self._forward_fn, jit_compile=True) if jit_compile
                         else self._forward_fn)
        self.memories = {}  # (B, T, M) -> key/value ring ReplicaMemory
        self.position_keys = {}  # (K, clamp_len) -> ReplicaPositionKeys
        self._loops = {}

    def settings(self, batch_size=None, tgt_len=None, mem_len=None, clamp_len=None,
                 same_length=None):
        """The evaluation settings: each one given, else the config's eval_*, else the training
        value (TransfoXLConfig.eval_settings, the one rule); checked."""
        s = dict(batch_size=self.global_batch if batch_size is None else batch_size,
                 **self.model.config.eval_settings(tgt_len=tgt_len, mem_len=mem_len,
                                                   clamp_len=clamp_len, same_length=same_length))
        if s["batch_size"] < 1:
            raise ValueError(f"eval batch size must be >= 1, got {s['batch_size']}")
        replicas = self.strategy.num_replicas_in_sync
        if s["batch_size"] % replicas:
            raise ValueError(f"eval batch size {s['batch_size']} is not divisible by {replicas} "
                             "replicas")
        return s

    def evaluate(self, split="valid", batch_size=None, tgt_len=None, mem_len=None,
                 clamp_len=None, same_length=None, max_batches=None, by_position=False):
        """Token-weighted loss over `split` (every token once unless max_batches), with memory.

        tgt_len/mem_len/clamp_len/same_length default as `settings` says (the config's eval_*,
        else the training values): evaluation may use the paper's longer memory with the same
        weights. Returns {"split", "loss", bpc or ppl,
        "tokens", "tgt_len", "mem_len", "clamp_len", "same_length"}; with `by_position` also
        "loss_by_position": the mean loss at each position 0..T-1 of the segments (the picture
        of context fragmentation: without memory it falls along the segment).
        """
        s = self.settings(batch_size, tgt_len, mem_len, clamp_len, same_length)
        by_position = bool(by_position)
        steps = self.data.eval_steps(split, s["batch_size"], s["tgt_len"])
        if max_batches:
            steps = min(steps, max_batches)
        loop = self.eval_begin(s, by_position=by_position)
        self.progress.begin(steps, split)
        iterator = self.batches(split, s)
        total = count = 0.0
        position_total = position_count = np.zeros(s["tgt_len"], np.float64)
        done = 0
        while done < steps:
            n = min(self.steps_per_loop, steps - done)
            nll_sum, tokens, nll_by_position, tokens_by_position = loop(iterator, tf.constant(n))
            total, count, done = total + float(nll_sum), count + float(tokens), done + n
            if by_position:
                position_total = position_total + np.asarray(nll_by_position, np.float64)
                position_count = position_count + np.asarray(tokens_by_position, np.float64)
            self.progress.update(done)
        self.progress.end()
        result = self.eval_end(split, s, total, count)
        if by_position:
            result["loss_by_position"] = (position_total / np.maximum(position_count, 1.0)
                                          ).tolist()
        return result

    def batches(self, split, s):
        """The iterator over `split`'s global batches for settings `s`."""
        return iter(self.data.dataset(split, s["batch_size"], False, s["tgt_len"]))

    def eval_begin(self, s, *, by_position=False):
        """An empty key/value memory and the position keys of the current weights; returns the
        host loop for settings `s` (traced once per settings): (iterator, n) -> the sums of
        loss and tokens over n batches, and per position of the segment ([T] each with
        `by_position`, else zeros [1])."""
        memory_key = (s["batch_size"], s["tgt_len"], s["mem_len"])
        if memory_key not in self.memories:
            self.memories[memory_key] = self.empty_memory(*memory_key)
        memory = self.memories[memory_key]
        memory.clear()
        keys_key = (s["mem_len"] + s["tgt_len"], s["clamp_len"])
        if keys_key not in self.position_keys:
            self.position_keys[keys_key] = ReplicaPositionKeys(
                self.strategy, self.model, *keys_key,
                f"eval_position_keys_{keys_key[0]}_{keys_key[1]}")
        position_keys = self.position_keys[keys_key]
        position_keys.refresh()  # once per pass: the weights may have changed since the last
        loop_key = (memory_key, keys_key, s["same_length"], by_position)
        if loop_key not in self._loops:
            strategy, same_length = self.strategy, s["same_length"]
            # Without by_position the per-position sums stay [1] zeros: no all-reduce of [T].
            width = s["tgt_len"] if by_position else 1

            @tf.function
            def eval_loop(iterator, n):
                total, count = tf.constant(0.0), tf.constant(0.0)
                position_total, position_count = tf.zeros([width]), tf.zeros([width])
                for _ in tf.range(n):
                    sums = strategy.run(self.eval_step, args=(
                        next(iterator), memory, position_keys, same_length, by_position))
                    nll_sum, tokens, nll_by_position, tokens_by_position = [
                        strategy.experimental_local_results(value)[0] for value in sums]
                    total += nll_sum
                    count += tokens
                    position_total += nll_by_position
                    position_count += tokens_by_position
                return total, count, position_total, position_count

            self._loops[loop_key] = eval_loop
        return self._loops[loop_key]

    def eval_end(self, split, s, total, count):
        mean = total / max(count, 1.0)
        return {"split": split, "loss": mean, self.metric: metric_value(self.metric, mean),
                "tokens": int(count), "tgt_len": s["tgt_len"], "mem_len": s["mem_len"],
                "clamp_len": s["clamp_len"], "same_length": s["same_length"]}

    # Evaluation reads a key/value memory: with fixed weights it is exactly what the training
    # memory would be projected to, and each step projects only its T new rows, written into a
    # ring in place of the oldest (`KeyValueRing`: no copy of the memory to append them). The
    # position keys (W_k,R R for K = M + T) are computed once per pass, not per step (see
    # ReplicaPositionKeys).
    def empty_memory(self, global_batch, tgt_len, mem_len):
        """An empty key/value ring of `mem_len` slots for segments of `tgt_len` tokens and
        `global_batch` rows (cross-replica)."""
        per_replica = global_batch // self.strategy.num_replicas_in_sync
        return ReplicaMemory(
            self.strategy, self.model.init_key_value_ring(per_replica, tgt_len, mem_len),
            f"eval_memory_{global_batch}_{tgt_len}_{mem_len}")

    # -- replica ------------------------------------------------------------------------------
    def _forward_fn(self, features, memory, position_keys, same_length):
        nll, new_memory = self.model(features["inputs"], memory, reset=features["reset"],
                                     targets=features["targets"], training=False,
                                     same_length=same_length, position_keys=position_keys)
        mask = tf.cast(features["target_mask"], tf.float32)
        nll = tf.cast(nll, tf.float32) * mask
        return nll, mask, new_memory

    def eval_step(self, features, memory: ReplicaMemory, position_keys: ReplicaPositionKeys,
                  same_length, by_position=False):
        """Scores this replica's rows; returns the global (sum of NLL, number of target tokens)
        and, with `by_position`, the same per position of the segment ([T] each; else [1]
        zeros).

        memory: a key/value ring (`empty_memory`); position_keys: for M + T, refreshed for this
        pass (they carry the clamp_len).
        """
        context = tf.distribute.get_replica_context()
        nll, mask, new_memory = self._forward(features, memory.read(), position_keys.read(),
                                              same_length)
        memory.write(new_memory)
        sums = [tf.reduce_sum(nll), tf.reduce_sum(mask)]
        sums += ([tf.reduce_sum(nll, axis=0), tf.reduce_sum(mask, axis=0)] if by_position
                 else [tf.zeros([1]), tf.zeros([1])])
        return tuple(context.all_reduce(tf.distribute.ReduceOp.SUM, value) for value in sums)
