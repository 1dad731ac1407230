"""The language model's task (tfxl-train, make demo) and tfxl-eval's evaluator.

`LanguageModelTask` is what train/loop/run.py's `TrainingRun` trains for a language model of any
architecture (`tfxl.models.language_model_class`: Transformer-XL or a baseline): the
streams of a tfxl-prepare data dir (train/tasks/datasets.py), the memory carried from step to step
on every
replica (train/loop/memory_state.py), the token-weighted mean loss, and the evaluation with memory
(train/loop/evaluator.py, train/loop/jax_evaluator.py: the backend's, train/backends/).
`make_evaluator` (tfxl-eval) builds only the model and the evaluator: no optimizer, no training
memory.

The task's step (`initial_memory`, `batch_weight`, `loss`) imports no TensorFlow: the JAX train
step runs it where none is installed (benchmarks/accelerator_bench.py). Its data and evaluation
(tf.data, TensorFlow's evaluator) import it when used.
"""

from keras import ops

from tfxl.config import TransfoXLConfig
from tfxl.data.manifest import check_manifest, load_manifest
from tfxl.model_dir import check_data_fingerprint, claim
from tfxl.models import build_language_model
from tfxl.checkpoints import warm_start as warm_starting
from tfxl.train.tasks.task import Task

__all__ = ["LanguageModelTask", "build_model", "make_evaluator"]


def build_model(config: TransfoXLConfig, strategy):
    """The language model of `config.architecture`, its weights created under `strategy`."""
    with strategy.scope():
        # Named as TransfoXLLM always was, whatever the architecture: the checkpoints' keys
        # are object paths, and the variables' names stay those of earlier runs.
        return build_language_model(config, name="transfo_xl_lm")


def load_data(config, strategy, data_dir, model_dir, seed):
    """The checked streams of `data_dir`: its manifest against `config` and against the data
    `model_dir` was trained on."""
    from tfxl.train.tasks.datasets import DistributedData
    manifest = load_manifest(data_dir)
    check_manifest(manifest, tgt_len=config.tgt_len, vocab_size=config.vocab_size)
    check_data_fingerprint(model_dir, manifest, data_dir)
    return DistributedData(strategy, data_dir, manifest, seed)


def make_evaluator(config, strategy, data_dir, model_dir, global_batch,
                   mixed_precision="float32", jit_compile=False, steps_per_loop=100,
                   progress=None):
    """tfxl-eval's evaluator: the model (weights not restored yet: `restore_weights`) and the
    evaluation state only, built with the process's dtype policy, which must be
    `mixed_precision` (`tfxl.train.backends.configure_process`, before). progress: show a
    progress bar (None: when stderr is a terminal)."""
    import keras

    from tfxl.train import backends
    from tfxl.train.loop.evaluator import EvalProgress
    policy = keras.config.dtype_policy().name
    if policy != mixed_precision:
        raise ValueError(f"mixed_precision={mixed_precision!r} is not the process's Keras dtype "
                         f"policy, {policy!r}: call tfxl.train.backends.configure_process("
                         "mixed_precision=..., seed=...) before the evaluator is built")
    data = load_data(config, strategy, data_dir, model_dir, seed=0)
    return backends.for_strategy(strategy).evaluator(
        build_model(config, strategy), data=data, global_batch=global_batch,
        steps_per_loop=steps_per_loop, jit_compile=jit_compile,
        progress=EvalProgress(progress))


class LanguageModelTask(Task):
    """Training a language model (`config.architecture`'s) on a tfxl-prepare data dir.

    Args:
      config: the model; its vocab_size and tgt_len must be the data's.
      data_dir: tfxl-prepare's output.
      init_checkpoint: weights a new run starts from (tfxl/checkpoints/warm_start.py; ignored,
        with a note, when the model_dir has checkpoints), or None.
    """

    def __init__(self, config: TransfoXLConfig, *, data_dir: str,
                 init_checkpoint: str | None = None):
        super().__init__(config, data_dir=data_dir)
        self.init_checkpoint = init_checkpoint

    def load_data(self, strategy, *, model_dir, seed):
        return load_data(self.config, strategy, self.data_dir, model_dir, seed)

    def build_model(self, strategy):
        return build_model(self.config, strategy)

    def warm_start(self, model, data, *, model_dir, resuming, log):
        del resuming  # warm_start looks at the model_dir itself (and says why it is ignored)
        return warm_starting.warm_start(self.init_checkpoint, model, model_dir, data.manifest,
                                        data.data_dir, log=log)

    def initial_memory(self, model, rows):
        return model.init_memory(rows)

    def batch_weight(self, batch):
        """The real targets of the batch's rows."""
        return ops.sum(ops.cast(batch["target_mask"], "float32"))

    def loss(self, model, batch, memory, global_weight):
        nll, new_memory = model(batch["inputs"], memory, reset=batch["reset"],
                                targets=batch["targets"], training=True)
        mask = ops.cast(batch["target_mask"], nll.dtype)
        # These rows' share of the global token-weighted mean (padding excluded): summing over
        # replicas gives the mean over every real target of the global batch.
        return ops.sum(nll * mask) / global_weight, new_memory

    def check_data(self, data, *, global_batch, evaluates):
        # Training slots own whole streams: the global batch must divide the stream count.
        check_manifest(data.manifest, global_batch_size=global_batch)
        # A corrupt valid shard must not surface only at the first evaluation, hours in.
        data.check_splits("train", *(["valid"] if evaluates else []))

    def claim_model_dir(self, model_dir, data):
        claim(model_dir, self.config, data.manifest, data.data_dir)

    def build_evaluator(self, model, strategy, data, *, global_batch, steps_per_loop,
                        jit_compile):
        from tfxl.train import backends
        return backends.for_strategy(strategy).evaluator(
            model, data=data, global_batch=global_batch, steps_per_loop=steps_per_loop,
            jit_compile=jit_compile)

    def evaluate(self, evaluator, data, split="valid", *, max_batches=None, **settings):
        """`Evaluator.evaluate` (settings: batch_size, tgt_len, mem_len, clamp_len,
        same_length)."""
        return evaluator.evaluate(split, max_batches=max_batches, **settings)

    def metric(self, data):
        from tfxl.train.loop.evaluator import metric_name
        return metric_name(data.manifest)
