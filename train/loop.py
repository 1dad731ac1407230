"""The host side of training and evaluation, in the TPU-Estimator style.

`steps_per_loop` steps run inside one `tf.function` (the Estimator's iterations_per_loop); the host
only logs, checkpoints and evaluates between loops. Memory lives on the replicas across loops
(train/memory_state.py) and is checkpointed with the model, optimizer, step and input iterator, so
a resumed run continues exactly where the last checkpoint stopped.

Shape glossary: B global batch, b per-replica batch, T segment length, M memory length.
"""

import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf

from tfxl.checkpoints import check_readable, newest_readable_checkpoint
from tfxl.config import TransfoXLConfig
from tfxl.data import pipeline
from tfxl.data.fingerprint import check_data_fingerprint
from tfxl.data.manifest import check_manifest, load_manifest, split_info
from tfxl.data.rechunk import rechunk
from tfxl.json_files import read_json, write_json_atomically
from train import summaries
from train.model_fn import ModelFn

LOG2 = math.log(2.0)


class TrainingDiverged(RuntimeError):
    """A non-finite loss; the message names the step. The last good checkpoint is kept."""


def truncate_log(path, last_step):
    """Drops log lines after `last_step` (steps a killed run did after its last checkpoint)."""
    if not tf.io.gfile.exists(path):
        return
    with tf.io.gfile.GFile(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= last_step]
    tmp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write("".join(kept))
    tf.io.gfile.rename(tmp, path, overwrite=True)


def check_or_store_config(model_dir, config, store=True):
    """Refuses a model_dir trained with another model; `store` writes config.json into a new one.

    The trainer checks early (store=False) and stores only once every other check has passed
    (Runner.train), so a run refused for a bad flag leaves no config.json that would refuse the
    corrected command.
    """
    path = os.path.join(model_dir, "config.json")
    if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
        raise ValueError(f"--model_dir={model_dir} is a file, not a directory")
    if tf.io.gfile.exists(path):
        stored = TransfoXLConfig.from_file(path).to_dict()
        wanted = config.to_dict()
        diff = {k: (stored.get(k), wanted.get(k)) for k in sorted(set(stored) | set(wanted))
                if stored.get(k) != wanted.get(k)}
        if diff:
            listing = ", ".join(f"{k}: model_dir has {a!r}, flags give {b!r}"
                                for k, (a, b) in diff.items())
            raise ValueError(f"--model_dir={model_dir} holds a different model ({listing}); "
                             "use a new --model_dir or the same model flags")
    elif store:
        tf.io.gfile.makedirs(model_dir)
        write_json_atomically(path, config.to_dict())


def metric_name(manifest):
    return "bpc" if manifest.get("is_character_level", False) else "ppl"


def metric_value(name, mean_nll):
    return mean_nll / LOG2 if name == "bpc" else float(np.exp(min(mean_nll, 50.0)))


class Runner:
    """Owns the model_fn, the data and the checkpoint of one job (training and evaluation)."""

    def __init__(self, config, strategy, data_dir, model_dir, global_batch, opt_params,
                 mixed_precision="float32", jit_compile=False, steps_per_loop=100, seed=0,
                 is_chief=True):
        self.config, self.strategy = config, strategy
        self.data_dir, self.model_dir = data_dir, model_dir
        self.manifest = load_manifest(data_dir)
        check_manifest(self.manifest, tgt_len=config.tgt_len, vocab_size=config.vocab_size)
        check_data_fingerprint(model_dir, self.manifest, data_dir)
        self.metric = metric_name(self.manifest)
        self.global_batch, self.steps_per_loop, self.seed = global_batch, steps_per_loop, seed
        self.train_steps = opt_params.train_steps
        self.is_chief = is_chief
        keras.config.set_dtype_policy(mixed_precision)
        keras.utils.set_random_seed(seed)  # same initial weights and dropout stream every run
        self.model_fn = ModelFn(config, strategy, global_batch, opt_params, mixed_precision,
                                jit_compile)
        self.model, self.optimizer = self.model_fn.model, self.model_fn.optimizer
        self._eval_memories = {}  # (batch, mem_len) -> key/value ReplicaMemory
        self._eval_position_keys = {}  # (K, clamp_len) -> ReplicaPositionKeys
        self._train_iterator = None
        self._train_loop = None
        self._eval_loops = {}

    # -- data ---------------------------------------------------------------------------------
    def _distributed(self, split, batch, training, tgt_len=None, skip_batches=0):
        """The split as a distributed dataset; `skip_batches` global steps already consumed."""
        tgt_len = tgt_len or self.manifest["tgt_len"]
        params = pipeline.InputParams(data_dir=self.data_dir, batch_size=batch, training=training,
                                      seed=self.seed)

        def dataset_fn(input_context):
            dataset = pipeline.input_fn(split, params, input_context)
            # A pipeline yields one per-replica batch per local replica and step.
            local_replicas = (input_context.num_replicas_in_sync
                              // input_context.num_input_pipelines)
            if tgt_len != self.manifest["tgt_len"]:
                dataset = rechunk(dataset, tgt_len, local_replicas)
            return dataset.skip(skip_batches * local_replicas) if skip_batches else dataset

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def check_splits(self, *splits):
        """Checks the shards of `splits` before the first step; a DataError names a bad one.

        Every shard must have its manifest byte size. Evaluation splits (small: megabytes) are
        also read once in full so every record's CRC is checked; the train split's records are
        checked by its input pipeline when it is built, still before the first step.
        """
        for split in splits:
            pipeline.verify_shards(self.data_dir, split_info(self.manifest, split)["streams"],
                                   crc=split != "train")

    # -- checkpoint ---------------------------------------------------------------------------
    def restore(self, log=print):
        """Restores the newest readable checkpoint (weights, optimizer, step, memory) and the input
        position; damaged checkpoints are skipped with a message (tfxl/checkpoints.py).

        Distributed tf.data iterators cannot be checkpointed under Mirrored/MultiWorker/TPU
        strategies, so the input position is the step: the pipeline is deterministic and is rebuilt
        skipping the `step` batches already consumed (one path for every strategy).
        """
        # Keras' SeedGenerator states (dropout) are variables but not tf trackables: checkpoint
        # them explicitly, or a resumed run would draw other dropout masks.
        seed_states = [v.value for v in self.model.non_trainable_variables
                       if "seed_generator_state" in v.path]
        rng = tf.train.Checkpoint(**{f"seed_{i}": v for i, v in enumerate(seed_states)})
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                         memory=self.model_fn.memory.checkpointed, rng=rng)
        chief_dir = os.path.join(self.model_dir, "checkpoints")
        directory = chief_dir
        if not self.is_chief:  # MultiWorker: every worker saves, only the chief's is kept
            directory = os.path.join(self.model_dir, "tmp_worker_checkpoints",
                                     str(self.strategy.cluster_resolver.task_id))
        self.manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=3)
        latest = newest_readable_checkpoint(chief_dir, log)
        if latest:
            try:
                checkpoint.restore(latest).assert_existing_objects_matched()
            except (tf.errors.OpError, AssertionError, ValueError) as err:
                raise ValueError(f"checkpoint {latest} does not fit this model/run: "
                                 f"{str(err).splitlines()[0]}") from None
            self.model_fn.memory.restore_from_checkpoint()
        step = int(self.optimizer.iterations.numpy())
        self._train_iterator = iter(self._distributed("train", self.global_batch, True,
                                                      skip_batches=step))
        return latest

    def save(self):
        self.model_fn.memory.save_to_checkpoint()
        return self.manager.save(checkpoint_number=int(self.optimizer.iterations.numpy()))

    def restore_weights_only(self, checkpoint_path=None, log=None):
        """For evaluation: model weights only, from `checkpoint_path` (which must read cleanly) or
        the model_dir's newest readable checkpoint."""
        if checkpoint_path:
            path = check_readable(checkpoint_path)
        else:
            path = newest_readable_checkpoint(os.path.join(self.model_dir, "checkpoints"), log)
        if not path:
            raise ValueError(f"no checkpoint in {self.model_dir}/checkpoints")
        try:
            tf.train.Checkpoint(model=self.model).restore(path).expect_partial(
            ).assert_existing_objects_matched()
        except (tf.errors.OpError, AssertionError, ValueError) as err:
            raise ValueError(f"checkpoint {path} does not fit this model: "
                             f"{str(err).splitlines()[0]}") from None
        return path

    # -- training -----------------------------------------------------------------------------
    def _make_train_loop(self):
        strategy, model_fn = self.strategy, self.model_fn

        @tf.function
        def train_loop(iterator, steps):
            losses = tf.TensorArray(tf.float32, size=steps)
            norms = tf.TensorArray(tf.float32, size=steps)
            for i in tf.range(steps):
                loss, norm = strategy.run(model_fn.train_step, args=(next(iterator),))
                losses = losses.write(i, strategy.experimental_local_results(loss)[0])
                norms = norms.write(i, strategy.experimental_local_results(norm)[0])
            return losses.stack(), norms.stack()

        return train_loop

    def train(self, save_every=None, eval_every=None, max_eval_batches=None, log=print):
        """Trains to `train_steps`; returns the final metrics dict (also in metrics.json).

        A model_dir already at `train_steps` has nothing to train: its metrics.json (the results of
        the run that did the work) is kept and returned with "nothing_to_do": True added.
        """
        # Training slots own whole streams: the global batch must divide the stream count.
        check_manifest(self.manifest, global_batch_size=self.global_batch)
        # A corrupt valid shard must not surface only at the first evaluation, hours in.
        self.check_splits("train", *(["valid"] if eval_every else []))
        if self.is_chief:  # every check has passed: only now is the model_dir claimed
            check_or_store_config(self.model_dir, self.config)
            check_data_fingerprint(self.model_dir, self.manifest, self.data_dir, store=True)
        restored = self.restore(log)
        step = int(self.optimizer.iterations.numpy())
        log_path = os.path.join(self.model_dir, "train_log.jsonl")
        metrics_path = os.path.join(self.model_dir, "metrics.json")
        if step >= self.train_steps:
            done = (read_json(metrics_path, "metrics") if tf.io.gfile.exists(metrics_path)
                    else {"step": step})
            return {**done, "nothing_to_do": True}
        if restored:
            log(f"resumed from {restored} at step {step}")
            if self.is_chief:
                truncate_log(log_path, step)
        self._train_loop = self._train_loop or self._make_train_loop()
        writer = (tf.summary.create_file_writer(os.path.join(self.model_dir, "train"))
                  if self.is_chief else tf.summary.create_noop_writer())
        tokens_per_step = self.global_batch * self.config.tgt_len
        progress = keras.utils.Progbar(self.train_steps, stateful_metrics=["loss", self.metric],
                                       verbose=1 if self.is_chief else 0)
        progress.update(step)
        metrics = {"start_step": step}
        started, trained = time.perf_counter(), 0
        while step < self.train_steps:
            n = min(self.steps_per_loop, self.train_steps - step)
            for every in (save_every, eval_every):
                if every:
                    n = min(n, every - step % every)
            loop_start = time.perf_counter()
            losses, norms = self._train_loop(self._train_iterator, tf.constant(n))
            losses, norms = losses.numpy(), norms.numpy()
            seconds = time.perf_counter() - loop_start
            bad = np.flatnonzero(~np.isfinite(losses))
            if bad.size:
                raise TrainingDiverged(
                    f"non-finite loss {losses[bad[0]]} at step {step + bad[0] + 1}; training "
                    f"stopped, the last good checkpoint in {self.model_dir}/checkpoints is kept")
            records = []
            with writer.as_default():
                for i, (loss, norm) in enumerate(zip(losses, norms)):
                    s = step + i + 1
                    lr = float(self.model_fn.schedule(s - 1))
                    records.append({"step": s, "loss": float(loss), "grad_norm": float(norm),
                                    "learning_rate": lr})
                    summaries.scalar("loss", loss, step=s)
                    summaries.scalar(self.metric, metric_value(self.metric, loss), step=s)
                    summaries.scalar("learning_rate", lr, step=s)
                    summaries.scalar("grad_norm", norm, step=s)
                summaries.scalar("tokens_per_second", n * tokens_per_step / seconds,
                                  step=step + n)
                summaries.scalar("steps_per_second", n / seconds, step=step + n)
            if self.is_chief:
                with open(log_path, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in records)
            step += n
            trained += n
            progress.update(step, [("loss", float(losses[-1])),
                                   (self.metric, metric_value(self.metric, losses[-1]))])
            if save_every and step % save_every == 0 or step == self.train_steps:
                self.save()
            if eval_every and step % eval_every == 0:
                result = self.evaluate("valid", max_batches=max_eval_batches)
                with writer.as_default():
                    summaries.scalar(f"valid_{self.metric}", result[self.metric], step=step)
                log(f"step {step}: valid {self.metric} {result[self.metric]:.4f}")
                metrics["valid"] = result
        elapsed = time.perf_counter() - started
        metrics.update(step=step, train_loss=float(losses[-1]) if trained else None,
                       train_tokens_per_second=trained * tokens_per_step / elapsed if trained
                       else None)
        if self.is_chief:
            write_json_atomically(metrics_path, metrics)
        writer.flush()
        return metrics

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self, split="valid", batch_size=None, tgt_len=None, mem_len=None,
                 clamp_len=None, same_length=None, max_batches=None):
        """Token-weighted loss over `split` (every token once unless max_batches), with memory.

        tgt_len/mem_len/clamp_len/same_length default to the training config; evaluation may use
        the paper's longer memory with the same weights. The memory is a key/value memory, empty
        at the start, and the position keys are computed once per call (`ModelFn.eval_step`).
        Returns {"loss", bpc or ppl, "tokens"}.
        """
        c = self.config
        batch = self.global_batch if batch_size is None else batch_size
        tgt_len = self.manifest["tgt_len"] if tgt_len is None else tgt_len
        mem_len = c.mem_len if mem_len is None else mem_len
        clamp_len = c.clamp_len if clamp_len is None else clamp_len
        same_length = c.same_length if same_length is None else same_length
        for name, value, low in (("eval batch size", batch, 1), ("tgt_len", tgt_len, 1),
                                 ("mem_len", mem_len, 0), ("clamp_len", clamp_len, -1)):
            if value < low:
                raise ValueError(f"evaluation {name} must be >= {low}, got {value}")
        replicas = self.strategy.num_replicas_in_sync
        if batch % replicas:
            raise ValueError(f"eval batch size {batch} is not divisible by {replicas} replicas")
        data_steps = pipeline.eval_steps(self.manifest, split, batch)
        steps = -(-data_steps * self.manifest["tgt_len"] // tgt_len)
        if max_batches:
            steps = min(steps, max_batches)
        key = (batch, mem_len)
        if key not in self._eval_memories:
            self._eval_memories[key] = self.model_fn.eval_memory(batch, mem_len)
        memory = self._eval_memories[key]
        memory.clear()
        keys_key = (mem_len + tgt_len, clamp_len)
        if keys_key not in self._eval_position_keys:
            self._eval_position_keys[keys_key] = self.model_fn.eval_position_keys(*keys_key)
        position_keys = self._eval_position_keys[keys_key]
        position_keys.refresh()  # once per pass: the weights may have changed since the last
        loop_key = (key, keys_key, same_length)
        if loop_key not in self._eval_loops:
            strategy, model_fn = self.strategy, self.model_fn

            @tf.function
            def eval_loop(iterator, n):
                total, count = tf.constant(0.0), tf.constant(0.0)
                for _ in tf.range(n):
                    s, k = strategy.run(model_fn.eval_step, args=(
                        next(iterator), memory, position_keys, same_length))
                    total += strategy.experimental_local_results(s)[0]
                    count += strategy.experimental_local_results(k)[0]
                return total, count

            self._eval_loops[loop_key] = eval_loop
        iterator = iter(self._distributed(split, batch, False, tgt_len))
        total = count = 0.0
        done = 0
        while done < steps:
            n = min(self.steps_per_loop, steps - done)
            s, k = self._eval_loops[loop_key](iterator, tf.constant(n))
            total, count, done = total + float(s), count + float(k), done + n
        mean = total / max(count, 1.0)
        return {"split": split, "loss": mean, self.metric: metric_value(self.metric, mean),
                "tokens": int(count), "tgt_len": tgt_len, "mem_len": mem_len,
                "clamp_len": clamp_len, "same_length": bool(same_length)}
