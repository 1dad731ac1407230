"""Keras 3's distribution API on JAX as a training run's strategy: the device mesh, data or
model parallelism, and the processes of a pod.

`resolve_distribution` turns `--strategy` (data_parallel, model_parallel; default: data
parallel over every device) and `--model_parallel` into a `JaxDistribution`: a
`keras.distribution.DataParallel` or `ModelParallel` over a ("batch", "model") mesh of every
device of every process, with what a run asks of its strategy (the replicas the batch is split
over, the host's input pipeline, the chief, the processes' agreement). On a pod each host runs
the same command; `--jax_coordinator` (or "auto" on Cloud TPU, where JAX finds its peers itself)
joins them through `keras.distribution.initialize` (`jax.distributed.initialize`).

Like tfxl/tpu/strategy.py this only resolves hardware: the layout of a model's variables comes
from the caller (`layout_map`, e.g. `TransfoXLLM.get_layout_map`).
"""

import contextlib
import logging
import os
import socket
import sys
import threading
import time

from absl import flags

from tfxl.tpu.strategy import JAX_STRATEGIES, StrategyError

BATCH, MODEL = "batch", "model"


FLAG_NAMES = ("model_parallel", "jax_coordinator", "jax_processes", "jax_process_id",
              "jax_join_timeout")
# Seconds the processes of a run wait for each other to join (--jax_join_timeout): JAX's own
# default, time for the hosts of a pod that start together to come up.
JOIN_TIMEOUT = 300
# JAX's own deadline is set this much later than ours: at its deadline JAX aborts the process
# (SIGABRT, no Python exception), so ours must come first to say what did not join.
JAX_DEADLINE_MARGIN = 60


def define_flags():
    """--model_parallel and the multi-process flags (idempotent)."""
    if "model_parallel" in flags.FLAGS:
        return
    flags.DEFINE_integer("model_parallel", 2, "JAX, --strategy=model_parallel: devices each "
                         "weight is split over (the mesh's model axis); the rest split the batch.")
    flags.DEFINE_string("jax_coordinator", None, "JAX on several hosts: the coordinator's "
                        "host:port (process 0's), or 'auto' where JAX finds its peers itself "
                        "(Cloud TPU pods, SLURM, Open MPI; one process where it finds none). "
                        "Unset: one process.")
    flags.DEFINE_integer("jax_processes", None, "JAX on several hosts: how many processes "
                         "(with --jax_coordinator=host:port).")
    flags.DEFINE_integer("jax_process_id", None, "JAX on several hosts: this process's index "
                         "(with --jax_coordinator=host:port).")
    flags.DEFINE_integer("jax_join_timeout", JOIN_TIMEOUT, "JAX on several hosts: seconds to "
                         "wait for every process to join (and the coordinator's host to "
                         "resolve); then the run stops naming what did not join.")


def coordinator_host_port(coordinator):
    """(host, port) of a --jax_coordinator=host:port ([v6 address]:port too); StrategyError
    names what is wrong with it."""
    host, colon, port = coordinator.rpartition(":")
    if not colon or not host or "]" in port:
        raise StrategyError(f"--jax_coordinator={coordinator} has no port: give process 0's "
                            "host:port, e.g. --jax_coordinator=10.0.0.1:1234 (a port free "
                            "there)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise StrategyError(f"--jax_coordinator={coordinator}: the port {port!r} is not a "
                            "number in [1, 65535]")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _resolves(host, port, deadline):
    """Whether `host` resolves before `deadline` (time.monotonic()), asking again every second:
    a pod's host names may appear only as its hosts come up."""
    while True:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            return True
        except (socket.gaierror, UnicodeError):
            if time.monotonic() + 1 > deadline:
                return False
            time.sleep(1)


def _answers(host, port):
    """Whether something accepts connections at host:port (the coordinator's service)."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def _not_joined(coordinator, num_processes, process_id, timeout):
    """What a process whose join timed out says: which processes did not join, as far as it
    can tell (process 0 holds the service; the others see whether it answers)."""
    waited = f"within {timeout} s (--jax_join_timeout)"
    if process_id == 0:
        others = ("process 1" if num_processes == 2 else
                  f"at least one of processes 1 to {num_processes - 1}")
        return (f"--jax_coordinator={coordinator}: {others} of --jax_processes={num_processes} "
                f"did not join process 0 {waited}; start every process with the same "
                "--jax_coordinator, each with its own --jax_process_id, and check that they "
                "reach this host's port")
    host, port = coordinator_host_port(coordinator)
    if not _answers(host, port):
        return (f"--jax_coordinator={coordinator}: process 0 (the coordinator) did not answer "
                f"there {waited}; start it (--jax_process_id=0) on that host, or correct "
                "--jax_coordinator")
    return (f"--jax_coordinator={coordinator}: process 0 answers, but not every one of the "
            f"--jax_processes={num_processes} processes joined {waited}; start the missing "
            "ones (process 0's log says which)")


def _stop_unjoined(message):
    """The deadline of a join: one `error:` line and exit status 2, from the watchdog thread.
    Nothing has been written yet; the main thread is inside JAX's connect, which no Python
    exception leaves, so the process ends here."""
    from tfxl.cli.errors import fail
    sys.stderr.flush()
    os._exit(fail(message))


def _join(coordinator, num_processes, process_id, timeout):
    """jax.distributed.initialize, bounded by `timeout` seconds (see _stop_unjoined). Keras'
    `keras.distribution.initialize` takes no timeout; the seed it would agree on between the
    processes is the run's own (`configure_process`), set on every process alike."""
    import jax
    from tfxl.cli import note
    deadline = time.monotonic() + timeout
    if coordinator == "auto":
        message = (f"--jax_coordinator=auto: not every process of the cluster JAX found joined "
                   f"within {timeout} s (--jax_join_timeout); run the same command on every "
                   "host")
        arguments = {}
    else:
        host, port = coordinator_host_port(coordinator)
        note(f"process {process_id} of {num_processes}: joining the others through "
             f"{coordinator} (waiting up to {timeout} s, --jax_join_timeout)")
        if not _resolves(host, port, deadline):
            raise StrategyError(f"--jax_coordinator={coordinator}: the host {host!r} did not "
                                f"resolve within {timeout} s (--jax_join_timeout); correct the "
                                "host name or use its address")
        message = None
        arguments = dict(coordinator_address=coordinator, num_processes=num_processes,
                         process_id=process_id)
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), lambda: _stop_unjoined(
        message or _not_joined(coordinator, num_processes, process_id, timeout)))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(**arguments,
                                   initialization_timeout=timeout + JAX_DEADLINE_MARGIN)
    except ValueError as err:
        if (coordinator != "auto" or jax.distributed.is_initialized()
                or "coordinator_address" not in str(err)):
            raise
        # JAX found no cluster to ask for the coordinator: one machine, one process.
        note("--jax_coordinator=auto: JAX finds no cluster here (a Cloud TPU pod, SLURM, "
             "Open MPI, ...): one process")
    finally:
        watchdog.cancel()


def initialize_processes(coordinator=None, num_processes=None, process_id=None,
                         join_timeout=JOIN_TIMEOUT):
    """Joins this process to the others of its run (nothing for one process), waiting at most
    `join_timeout` seconds for them (then one `error:` line naming what did not join, exit
    status 2). On CPU the processes' collectives go through gloo (the tests run a pod as
    processes on one host)."""
    if not coordinator:
        if num_processes not in (None, 1):
            raise StrategyError(f"--jax_processes={num_processes} needs --jax_coordinator")
        return
    if coordinator != "auto":
        coordinator_host_port(coordinator)  # before JAX: an address without a port
    if coordinator != "auto" and (num_processes is None or process_id is None):
        raise StrategyError(f"--jax_coordinator={coordinator} needs --jax_processes and "
                            "--jax_process_id (or --jax_coordinator=auto on a Cloud TPU pod)")
    if coordinator != "auto" and not 0 <= process_id < num_processes:
        raise StrategyError(f"--jax_process_id={process_id} is out of range: it must be in "
                            f"[0, --jax_processes={num_processes})")
    if join_timeout is None or join_timeout <= 0:
        raise StrategyError(f"--jax_join_timeout={join_timeout} is out of range: it must be > 0")
    import jax
    if not jax.config.jax_platforms or "cpu" in jax.config.jax_platforms:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        _join(coordinator, num_processes, process_id, join_timeout)
    except (RuntimeError, ValueError) as err:
        if isinstance(err, StrategyError):
            raise
        raise StrategyError(f"--jax_coordinator={coordinator}: the processes could not join "
                            f"({type(err).__name__}: {err})") from None


def local_devices_or_error():
    """jax.devices(), or StrategyError where the platform JAX was told to use does not start
    (JAX_PLATFORMS=tpu where no TPU runtime is installed)."""
    import jax
    try:
        return jax.devices()
    except RuntimeError as err:
        platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or ""
        why = str(err).split(" (set JAX_PLATFORMS", 1)[0]
        raise StrategyError(f"JAX_PLATFORMS={platforms}: JAX could not start it ({why}); "
                            "where its runtime is not installed (jax[tpu], jax[cuda12]) use "
                            "JAX_PLATFORMS=cpu, or unset JAX_PLATFORMS for what is there") \
            from None


class JaxDistribution:
    """What a training run asks of its strategy, on JAX.

    Args:
      kind: "data_parallel" or "model_parallel".
      model_parallel: the mesh's model axis (model_parallel only); the batch axis is the rest.
      layout_map: (keras DeviceMesh) -> keras LayoutMap, the variables' layouts under
        model_parallel.
    """

    def __init__(self, kind, *, model_parallel=1, layout_map=None):
        import jax
        import keras
        devices = local_devices_or_error()
        model_axis = model_parallel if kind == "model_parallel" else 1
        if model_axis < 1 or len(devices) % model_axis:
            raise StrategyError(f"--model_parallel={model_parallel} does not divide the "
                                f"{len(devices)} devices")
        self.kind = kind
        self.mesh_shape = (len(devices) // model_axis, model_axis)
        # Data parallelism on a 1-D mesh (Keras' DataParallel takes no other).
        shape, axes = ((self.mesh_shape, (BATCH, MODEL)) if kind == "model_parallel"
                       else (self.mesh_shape[:1], (BATCH,)))
        names = [f"{d.platform}:{d.id}" for d in devices]
        self.device_mesh = keras.distribution.DeviceMesh(shape, axes, names)
        if kind == "model_parallel":
            if layout_map is None:
                raise StrategyError("--strategy=model_parallel needs the model's layout map")
            self.distribution = keras.distribution.ModelParallel(
                layout_map=layout_map(self.device_mesh), batch_dim_name=BATCH)
        else:
            self.distribution = keras.distribution.DataParallel(device_mesh=self.device_mesh)
        import numpy as np
        # The mesh Keras lays the variables out on (equal meshes: one computation).
        self.mesh = jax.sharding.Mesh(np.array(devices).reshape(shape), axes)
        self.num_replicas_in_sync = self.mesh_shape[0]
        self.process_index, self.process_count = jax.process_index(), jax.process_count()
        self.is_chief = self.process_index == 0
        self.local_device_names = [f"/device:{d.platform.upper()}:{d.id}"
                                   for d in jax.local_devices()]

    def __repr__(self):
        return (f"JaxDistribution({self.kind}, mesh batch {self.mesh_shape[0]} x model "
                f"{self.mesh_shape[1]}, {self.process_count} process(es))")

    @contextlib.contextmanager
    def scope(self):
        """Variables created inside are laid out on the mesh (Keras' distribution scope)."""
        with self.distribution.scope():
            yield

    def sharding(self, batch_axis=0, rank=1):
        """A NamedSharding of an array of `rank` split along the mesh's batch axis at
        `batch_axis`, replicated over the model axis."""
        import jax
        spec = [None] * rank
        spec[batch_axis] = BATCH
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*spec))

    def replicated(self):
        import jax
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

    def global_array(self, local, batch_axis=0):
        """The global array whose rows along `batch_axis` this process holds `local` of (its
        input pipeline's rows: the processes' rows in process order)."""
        import jax
        import numpy as np
        local = np.asarray(local)
        return jax.make_array_from_process_local_data(
            self.sharding(batch_axis, local.ndim), local)

    def split_along_batch(self, value):
        """The global array of `value` (the same whole array on every process), its axis 0
        split along the mesh's batch axis (a scalar, such as a ring's next slot, on every
        device)."""
        import jax
        import numpy as np
        value = np.asarray(value)
        sharding = self.sharding(0, value.ndim) if value.ndim else self.replicated()
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    def distribute_datasets_from_function(self, dataset_fn):
        """This process's input pipeline: the rows of its devices, one batch of
        global / processes rows per step (the slots `tfxl.data.pipeline.input_fn` gives the
        pipeline of that index), as tf.distribute calls `dataset_fn`."""
        import tensorflow as tf
        return dataset_fn(tf.distribute.InputContext(
            num_input_pipelines=self.process_count, input_pipeline_id=self.process_index,
            num_replicas_in_sync=self.process_count))

    def device_memory_bytes(self):
        """The memory each local accelerator may use (the smallest), or None where JAX does not
        say (CPU, some TPU runtimes)."""
        import jax
        try:
            limits = [(d.memory_stats() or {}).get("bytes_limit") for d in jax.local_devices()]
        except Exception:  # no answer is "not checked", never a failed run
            return None
        return min(limits) if limits and all(limits) else None

    def to_numpy(self, value):
        """A (possibly sharded, possibly multi-host) array's whole value on this host."""
        import numpy as np
        if getattr(value, "is_fully_addressable", True):
            return np.asarray(value)
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(value, tiled=True))

    def all_processes(self, value):
        """[processes] of `value` (an int) from every process, in process order (a collective:
        every process calls it at the same point)."""
        import numpy as np
        if self.process_count == 1:
            return np.array([value])
        from jax.experimental import multihost_utils
        # Tiled: the processes' [1] arrays end to end, [processes] (stacked: [processes, 1]).
        return np.asarray(multihost_utils.process_allgather(np.array([value], np.int32),
                                                            tiled=True))


def resolve_distribution(strategy="default", *, model_parallel=2, layout_map=None,
                         coordinator=None, num_processes=None, process_id=None,
                         join_timeout=JOIN_TIMEOUT):
    """The `JaxDistribution` named by `strategy` (default: data parallel over every device of
    every process), after joining the run's processes. StrategyError says why one cannot run."""
    if strategy not in ("default",) + JAX_STRATEGIES:
        raise StrategyError(f"--strategy={strategy} is a TensorFlow strategy; on JAX "
                            f"(KERAS_BACKEND=jax) it is default, {', '.join(JAX_STRATEGIES)}")
    # TensorFlow runs the input pipeline and writes the files on the host: it must not take
    # the accelerators' memory from JAX (it would on a GPU; tf.data needs none). Where it is
    # not installed there is nothing to hide (the step trains on numpy input there).
    try:
        import tensorflow as tf
    except ImportError:
        tf = None
    if tf is not None:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # TensorFlow's devices are initialised already (a test process)
            pass
    # JAX's probe of every platform logs each one it lacks ("Unable to initialize backend
    # 'tpu'") at INFO, which absl's handler prints: a run says which devices it has in its plan.
    # Likewise its "Connecting to JAX distributed service": the run's own note says so.
    for name in ("jax._src.xla_bridge", "jax._src.distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    initialize_processes(coordinator, num_processes, process_id, join_timeout)
    kind = "data_parallel" if strategy == "default" else strategy
    return JaxDistribution(kind, model_parallel=model_parallel, layout_map=layout_map)


def distribution_from_flags(layout_map=None, flag_values=flags.FLAGS):
    return resolve_distribution(flag_values.strategy, model_parallel=flag_values.model_parallel,
                                layout_map=layout_map, coordinator=flag_values.jax_coordinator,
                                num_processes=flag_values.jax_processes,
                                process_id=flag_values.jax_process_id,
                                join_timeout=flag_values.jax_join_timeout)
