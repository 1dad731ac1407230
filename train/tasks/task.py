"""What one kind of model's training is, in the manner of Model Garden's Task: the data it reads
and checks, the model, the state carried from step to step, the loss, the evaluation and what a
finished run publishes. train/loop/run.py's `TrainingRun` is the rest, the same for every task
(checks, lease, records, resume, controller, signals, metrics.json); train/loop/train_step.py's
`TrainStep` compiles the task's loss into the optimisation step.

The tasks: `tfxl.train.tasks.language_model.LanguageModelTask` (tfxl-train, make demo) and
`tfxl.train.tasks.classification.ClassificationTask` (tfxl-classify-train).
"""

import abc

from tfxl.config import TransfoXLConfig
from tfxl.model_dir import LANGUAGE_MODEL


class Task(abc.ABC):
    """One kind of model's training; a subclass defines every abstract method (Python refuses to
    instantiate one that does not).

    Args:
      config: the model's (or the backbone's) `TransfoXLConfig`; stored as config.json.
      data_dir: the prepared data the run reads.
    """

    unit = "tokens"  # what the run's throughput counts
    run_kind = LANGUAGE_MODEL  # what its model_dir holds (tfxl.model_dir.RUN_KINDS)

    def __init__(self, config: TransfoXLConfig, *, data_dir: str):
        self.config, self.data_dir = config, data_dir

    # -- before anything is built ---------------------------------------------------------------
    @abc.abstractmethod
    def load_data(self, strategy, *, model_dir: str, seed: int):
        """The data the run reads (with `manifest`, `data_dir`, `check_splits(*splits)` and
        `dataset(split, batch, training, skip_batches=0)`): its manifest checked against the
        model and against the data `model_dir` was trained on. Reads only."""

    def recorded_settings(self, data) -> dict:
        """The task's settings recorded in run.json beside the run's own (a resumed run with
        others is refused, as a changed learning rate is)."""
        return {}

    # -- the model and its step -----------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self, strategy):
        """The model, its weights created under `strategy`."""

    def warm_start(self, model, data, *, model_dir: str, resuming: bool, log) -> str | None:
        """Loads the weights a new run starts from into `model`; returns where they came from,
        or None. Writes nothing (the model_dir is not claimed yet)."""
        del model, data, model_dir, resuming, log
        return None

    @abc.abstractmethod
    def initial_memory(self, model, rows: int):
        """The empty state carried from step to step for `rows` rows of a batch (a memory of
        `tfxl.layers.memory`, checkpointed with the model), or None for none. The train step
        keeps it where its backend keeps state: per replica on TensorFlow, sharded along the
        batch on JAX."""

    @abc.abstractmethod
    def batch_weight(self, batch):
        """What the rows of `batch` (a replica's, or the whole batch on JAX) count for in the
        global mean loss: a float32 scalar, in `keras.ops` (the step runs on either backend)."""

    @abc.abstractmethod
    def loss(self, model, batch, memory, global_weight):
        """(the share of the global mean loss of `batch`'s rows, the new training memory or
        None), in training mode and `keras.ops`; `global_weight` is `batch_weight` of the whole
        global batch."""

    # -- checks, evaluation and results ---------------------------------------------------------
    @abc.abstractmethod
    def check_data(self, data, *, global_batch: int, evaluates: bool):
        """Refuses data that cannot train (or evaluate, when `evaluates`), before anything is
        written: a ValueError (DataError) naming what is wrong."""

    @abc.abstractmethod
    def claim_model_dir(self, model_dir: str, data):
        """Writes (or checks) the model_dir's records of the model and data: every check has
        passed."""

    @abc.abstractmethod
    def build_evaluator(self, model, strategy, data, *, global_batch: int, steps_per_loop: int,
                        jit_compile: bool):
        """What `evaluate` evaluates with (built once: its steps are traced once); an evaluator
        of the backend's own is `tfxl.train.backends.for_strategy(strategy).evaluator(...)`."""

    @abc.abstractmethod
    def evaluate(self, evaluator, data, split: str = "valid", *, max_batches=None, **settings):
        """The evaluation of `split` with the current weights: a dict of results."""

    def metric(self, data) -> str | None:
        """A metric of the training loss shown beside it ("bpc", "ppl"), or None."""
        return None

    def eval_scalars(self, data) -> tuple:
        """The names in `evaluate`'s result that are logged and sent to TensorBoard."""
        return (self.metric(data),)

    def units_per_step(self, global_batch: int) -> int:
        """How many `unit`s one step of `global_batch` rows trains on."""
        return global_batch * self.config.tgt_len

    def publish_results(self, model, model_dir: str, metrics: dict):
        """What the chief writes once training has reached train_steps, before metrics.json
        (nothing: the checkpoints are the result); may add to `metrics`."""
