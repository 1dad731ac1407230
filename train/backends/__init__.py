"""One seam per Keras backend: what a training run builds and asks that depends on the backend.

A training run's code (train/loop/run.py, the tools, the plan, the stop agreement, the run record)
is the same on every backend; what differs is behind one interface, `Backend`, with one class
per backend, each built from the run's strategy:

* `tensorflow.TensorFlowBackend`: a `tf.distribute` strategy (tfxl/tpu/strategy.py), the
  replica step of train/loop/train_step.py, the evaluator of train/loop/evaluator.py;
* `jax.JaxBackend`: a `tfxl.tpu.jax_mesh.JaxDistribution`, the functional step of
  train/loop/jax_train_step.py, the evaluator of train/loop/jax_evaluator.py.

`for_strategy` is the one place that picks between them, by the backend Keras runs on
(KERAS_BACKEND); `strategy_from_flags` resolves the strategy a tool runs under on that backend
(resolving itself is tfxl/tpu's) and refuses a TensorFlow-only tool on another backend.
`configure_process` sets what is process-wide, the dtype policy and the seed, once, before a run
is built.

Importing this package loads neither TensorFlow nor JAX (the tools' --help imports them only
when they resolve a strategy).
"""

from typing import Any, Callable, Protocol, Sequence

__all__ = ["Backend", "configure_process", "for_strategy", "strategy_from_flags"]


class Backend(Protocol):
    """What a training run builds and asks of its backend (the run's strategy is `strategy`).

    Builders, keyword options as Orbit's: `train_step`, `evaluator`, `training_memory`,
    `training_checkpoint`. Questions: `is_chief`, `worker_index`, `strategy_kind`, `replicas`,
    `local_devices`, `device_kind`, `model_axis`, `device_memory_bytes`, `worker_tasks`,
    `stop_agreement`.
    """

    strategy: Any
    name: str  # the Keras backend: "tensorflow" or "jax" (what tfxl.sizing's step costs are of)
    # Whether each host-loop length is compiled on its own (the controller's short first loops).
    each_loop_length_compiles: bool

    # -- what it builds -------------------------------------------------------------------------
    def train_step(self, task, model, *, data, global_batch: int, optimizer,
                   mixed_precision: str = "float32", jit_compile: bool = False):
        """The compiled optimisation step of `task`'s loss (`step`, `train(n)`,
        `train_loop_begin`, `rewind_input`, `optimizer`, `memory`, `schedule`)."""

    def evaluator(self, model, *, data, global_batch: int, steps_per_loop: int = 100,
                  jit_compile: bool = False, progress=None):
        """The language model's evaluator of `data`'s splits (progress: an `EvalProgress`)."""

    def training_memory(self, empty):
        """The holder of a training memory that starts as `empty` (the memory of the batch's
        rows a step reads: one replica's on TensorFlow, the global batch's on JAX)."""

    def training_checkpoint(self, model, *, optimizer, memory, model_dir: str,
                            worker_id: int | None = None):
        """The training checkpoint of the model, optimizer, training memory and dropout seeds
        (worker_id: None on the chief, else this worker's index)."""

    # -- what the run asks ----------------------------------------------------------------------
    @property
    def is_chief(self) -> bool:
        """Whether this process writes the model_dir's records (worker 0, or the chief)."""

    @property
    def worker_index(self) -> int:
        """This process's index among the run's (its checkpoints' folder when not the chief)."""

    @property
    def strategy_kind(self) -> str:
        """The strategy's name that run.json records ("mirrored", "data_parallel", ...)."""

    @property
    def replicas(self) -> int:
        """The replicas the global batch is split over."""

    @property
    def local_devices(self) -> list:
        """The names of this host's devices that run replicas."""

    @property
    def device_kind(self) -> str:
        """"TPU", "GPU" or "CPU": what the local devices are."""

    @property
    def model_axis(self) -> int:
        """The devices of one replica, each holding a part of its weights (1: whole)."""

    def device_memory_bytes(self) -> int | None:
        """The memory each local accelerator may use (the smallest), or None where it is not
        reported."""

    def worker_tasks(self) -> tuple[list, int]:
        """(every worker's name in cluster order, this process's place); (["worker 0"], 0) for
        one process."""

    def stop_agreement(self) -> Callable[[int], Sequence[int]] | None:
        """(this worker's signal number or 0) -> every worker's, in `worker_tasks` order: a
        collective every worker calls at the same points; None with one worker."""


def device_kind(devices):
    """"TPU", "GPU" or "CPU": what the devices named `devices` are."""
    devices = " ".join(devices).upper()
    return next((kind for kind in ("TPU", "GPU") if f"{kind}:" in devices), "CPU")


def _backend_name():
    import keras
    return keras.backend.backend()


def for_strategy(strategy) -> Backend:
    """The `Backend` of the Keras backend this process runs on, for the run's `strategy` (a
    tf.distribute strategy on TensorFlow, a `JaxDistribution` on JAX)."""
    name = _backend_name()
    if name == "jax":
        from tfxl.train.backends.jax import JaxBackend
        return JaxBackend(strategy)
    if name == "tensorflow":
        from tfxl.train.backends.tensorflow import TensorFlowBackend
        return TensorFlowBackend(strategy)
    raise ValueError(f"strategy={strategy!r}: tfxl trains on TensorFlow or JAX, and Keras runs "
                     f"on {name} here (KERAS_BACKEND)")


def refuse_unless_tensorflow():
    """StrategyError unless Keras runs on TensorFlow: for the tools that are TensorFlow code
    (every tool but tfxl-train)."""
    from tfxl.backend import check_tensorflow_tool
    from tfxl.tpu.strategy import StrategyError
    check_tensorflow_tool(StrategyError)


def strategy_from_flags(flag_values=None, *, jax_layout_map=None, mixed_precision=None):
    """The strategy a tool runs under, from --strategy/--tpu/--num_gpus (and on JAX
    --model_parallel/--jax_*): a tf.distribute strategy on TensorFlow. A tool that also trains on
    JAX (tfxl-train) gives `jax_layout_map` ((keras DeviceMesh) -> LayoutMap, for
    model_parallel) and its `mixed_precision` (checked first: the JAX step trains with
    float32 or bfloat16); the others are refused on another backend. StrategyError says why a
    strategy cannot run."""
    from absl import flags

    from tfxl.tpu import strategy as tf_strategies
    flag_values = flags.FLAGS if flag_values is None else flag_values
    if jax_layout_map is not None and _backend_name() == "jax":
        from tfxl.tpu import jax_mesh
        from tfxl.train.loop.jax_train_step import check_precision
        check_precision(mixed_precision)  # before the plan: not said, then refused
        return jax_mesh.distribution_from_flags(layout_map=jax_layout_map,
                                                flag_values=flag_values)
    tf_strategies.check_strategy_name(flag_values.strategy)
    refuse_unless_tensorflow()
    return tf_strategies.strategy_from_flags(flag_values)


def configure_process(*, mixed_precision="float32", seed=0):
    """Sets what every model and step of this process is built with, once, before a run or an
    evaluator is built: the Keras dtype policy `mixed_precision` and the seed of the weights,
    dropout and sampling (Python's, numpy's, the backend's and Keras' global seed), so that a run
    starts from the same weights every time."""
    import keras
    keras.config.set_dtype_policy(mixed_precision)
    keras.utils.set_random_seed(seed)
