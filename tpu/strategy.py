"""One function turns `--strategy/--tpu/--num_gpus` into a `tf.distribute.Strategy`.

This package only resolves hardware: it knows nothing of the model, the data or the training loop.
Importing it loads no TensorFlow (the tools' --help defines these flags): resolving a strategy does.
"""

import json
import os

from absl import flags

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored", "tpu")
# tfxl-train's on JAX (KERAS_BACKEND=jax): Keras 3's distribution API (tfxl/tpu/jax_mesh.py).
JAX_STRATEGIES = ("data_parallel", "model_parallel")


class StrategyError(RuntimeError):
    """The requested strategy cannot run on this machine; the message says why."""


def define_flags():
    """Defines --strategy, --tpu and --num_gpus (idempotent)."""
    if "strategy" in flags.FLAGS:
        return
    flags.DEFINE_enum("strategy", "default", STRATEGIES + JAX_STRATEGIES,
                      "tf.distribute strategy: default (no distribution), one_device, mirrored "
                      "(all local GPUs, or --num_gpus of them; CPU if none), "
                      "multi_worker_mirrored (TF_CONFIG), tpu. tfxl-train on JAX "
                      "(KERAS_BACKEND=jax): default or data_parallel (every device of every "
                      "process), model_parallel (with --model_parallel).")
    flags.DEFINE_string("tpu", None, "TPU name, grpc://address, or 'local' on a TPU VM.")
    flags.DEFINE_integer("num_gpus", None, "GPUs for --strategy=mirrored/one_device; "
                         "default: all visible.")


def strategy_from_flags(flag_values=flags.FLAGS):
    return resolve_strategy(flag_values.strategy, tpu=flag_values.tpu,
                            num_gpus=flag_values.num_gpus)


def _gpus(num_gpus, strategy):
    import tensorflow as tf
    found = tf.config.list_logical_devices("GPU")
    if num_gpus is None:
        return [d.name for d in found]
    if num_gpus > len(found):
        raise StrategyError(f"--strategy={strategy} asked for --num_gpus={num_gpus} but this "
                            f"machine has {len(found)} GPU(s)")
    return [d.name for d in found[:num_gpus]]


def check_strategy_name(strategy):
    """StrategyError unless `strategy` names a tf.distribute strategy (a JAX one is refused
    with where it runs)."""
    if strategy in JAX_STRATEGIES:
        raise StrategyError(f"--strategy={strategy} is Keras' distribution API on JAX: "
                            "tfxl-train with KERAS_BACKEND=jax (README, \"Train on JAX\")")
    if strategy not in STRATEGIES:
        raise StrategyError(f"--strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")


def resolve_strategy(strategy="default", tpu=None, num_gpus=None):
    """The strategy named by `strategy`, connected and initialised.

    tpu: resolves the cluster (`tpu` is a name, grpc address or 'local'), connects, initialises the
      TPU system and returns TPUStrategy; on a pod every host runs the same program.
    multi_worker_mirrored: reads the cluster from TF_CONFIG (must be set, with this worker's task).
    mirrored: all visible GPUs (or the first `num_gpus`), or every logical CPU when there is no GPU
      (which is how the tests emulate two devices).
    one_device: the first GPU if any, else the CPU. default: TensorFlow's default strategy.
    Raises StrategyError with the reason when the hardware or configuration is missing. Keras
    must run on TensorFlow: a tool refuses another backend before (tfxl.train.backends,
    tfxl.backend.check_tensorflow_tool).
    """
    check_strategy_name(strategy)
    import tensorflow as tf
    if strategy == "default":
        return tf.distribute.get_strategy()
    if strategy == "one_device":
        gpus = _gpus(num_gpus, strategy)
        return tf.distribute.OneDeviceStrategy(gpus[0] if gpus else "/cpu:0")
    if strategy == "mirrored":
        devices = _gpus(num_gpus, strategy) or [d.name for d in
                                                tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if strategy == "multi_worker_mirrored":
        raw = os.environ.get("TF_CONFIG")
        if not raw:
            raise StrategyError("--strategy=multi_worker_mirrored needs TF_CONFIG with a 'cluster' "
                                "and this process's 'task' (see BUILD.md)")
        try:
            spec = json.loads(raw)
            spec["cluster"], spec["task"]["type"], spec["task"]["index"]
        except (ValueError, KeyError, TypeError) as err:
            raise StrategyError(f"TF_CONFIG is not a valid cluster spec ({err!r}): {raw}") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    # TPU
    if not tpu:
        raise StrategyError("--strategy=tpu needs --tpu (a TPU name, grpc://address, or 'local' "
                            "on a TPU VM)")
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu="" if tpu == "local" else tpu)
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError, RuntimeError) as err:
        raise StrategyError(f"--strategy=tpu --tpu={tpu}: no TPU could be reached "
                            f"({type(err).__name__}: {err})") from None
    return tf.distribute.TPUStrategy(resolver)
