"""The plan of `tfxl-train` (`TrainingPlan`) and of `tfxl-classify-train` (`ClassificationPlan`),
printed before the first step: the model, the tokens of a step and an estimate of the memory a
replica needs; a run whose estimate exceeds the machine's memory is
refused before it allocates anything (`--ignore_memory_estimate` runs it anyway), and
`--dry_run` prints the plan and stops. `tfxl-eval` checks its evaluation the same way
(`check_evaluation_memory`), before it builds the model.

The estimate is tfxl/sizing.py's (weights, gradients, optimizer slots, gradient copies, memory
state, activations, evaluation memory, the step's program and a margin), computed from the config
and the backend; `TrainingPlan.with_compiled` puts JAX's memory_analysis of the compiled step in
place of the counted items where one is at hand. What it is compared with:

* CPU: the host's physical memory (or the cgroup limit of the container, when lower), against
  the whole process: the runtime already resident (TensorFlow, JAX), every local replica's
  estimate, the global copy of the training memory a checkpoint is saved from, and the run's own
  (sizing.RUN_BYTES: the input pipeline, the checkpoint writer, the summaries);
* GPU: each GPU's memory as TensorFlow's allocator reports it, against one replica's estimate;
* TPU, or a GPU whose memory TensorFlow does not report: not checked (the plan says so);
  `--memory_limit_gib` gives the limit by hand on any device.
"""

import sys

from absl import flags

from tfxl import sizing
from tfxl.host import host_memory_bytes, resident_bytes
from tfxl.train import backends

GIB = 2**30
MIB = 2**20
# A refusal names the model's size flags that at least this share of its parameters grows with.
MODEL_FLAG_SHARE = 0.1


def define_flags():
    flags.DEFINE_bool("dry_run", False, "Print the plan (parameters, tokens per step, memory "
                      "estimate per replica) and exit; nothing is written.")
    flags.DEFINE_bool("ignore_memory_estimate", False, "Train even when the memory estimate "
                      "exceeds the machine's memory.")
    flags.DEFINE_float("memory_limit_gib", None, "The memory to plan against, in GiB (default: "
                       "the host's RAM on CPU, for the whole process; each GPU's memory on GPU, "
                       "per replica; TPU: not checked).")


def _size(n):
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / 1024:.0f} KiB"




class TrainingPlan:
    """What a training run will do and need, before it does anything.

    Args:
      config: the model. global_batch: streams per step. replicas, local_replicas: in the whole
        run and on this host. device: "CPU", "GPU" or "TPU". mixed_precision, optimizer,
        jit_compile: the flags'. eval_settings: config.eval_settings() when the run evaluates,
        else None. model_axis: the devices of one replica (JAX model_parallel), each holding
        a part of its weights. device_memory: () -> each accelerator's bytes or None (the
        backend's `device_memory_bytes`; default: not known).
    """

    def __init__(self, config, global_batch, replicas=1, local_replicas=1, device="CPU",
                 mixed_precision="float32", optimizer="adam", eval_settings=None,
                 jit_compile=False, *, model_axis=1, device_memory=None, backend="tensorflow"):
        self._set_run(config, global_batch, replicas, local_replicas, device, mixed_precision,
                      optimizer, model_axis, device_memory, backend)
        self.footprint = sizing.training_footprint(config, self.per_replica_batch,
                                                   mixed_precision, optimizer, eval_settings,
                                                   jit_compile, backend)

    def with_compiled(self, analysis_bytes):
        """The plan with JAX's word for one replica's step: `sizing.compiled_bytes` of the
        compiled step's `memory_analysis()` (the best number there is; the plan says so)."""
        self.footprint = self.footprint.with_compiled(analysis_bytes)
        return self

    def _set_run(self, config, global_batch, replicas, local_replicas, device, mixed_precision,
                 optimizer, model_axis=1, device_memory=None, backend="tensorflow"):
        if global_batch % replicas:
            raise ValueError(f"--train_batch_size={global_batch} is not divisible by the "
                             f"{replicas} replicas")
        self.config, self.global_batch, self.replicas = config, global_batch, replicas
        self.local_replicas, self.device = local_replicas, device
        self.mixed_precision, self.optimizer = mixed_precision, optimizer
        self.per_replica_batch = global_batch // replicas
        self.model_axis, self.device_memory = model_axis, device_memory
        self.backend = backend
        self.runtime = None  # the resident bytes check_memory measured (before any build)

    @classmethod
    def for_strategy(cls, config, strategy, global_batch, mixed_precision, optimizer,
                     evaluates=False, jit_compile=False):
        backend = backends.for_strategy(strategy)
        # JAX model_parallel: a replica is `model_axis` devices, each holding a part of the
        # weights (`device_bytes`).
        model_axis = backend.model_axis
        return cls(config, global_batch, backend.replicas,
                   max(1, len(backend.local_devices) // model_axis), backend.device_kind,
                   mixed_precision, optimizer, config.eval_settings() if evaluates else None,
                   jit_compile, model_axis=model_axis,
                   device_memory=backend.device_memory_bytes,
                   backend=backend.name)

    @property
    def tokens_per_step(self):
        return self.global_batch * self.config.tgt_len

    @property
    def checkpoint_memory_bytes(self):
        """The global training memory ([B, L, M, D] for Transformer-XL) a checkpoint is saved
        from (host memory)."""
        return self.global_batch * sizing.training_memory_row_bytes(self.config,
                                                                     self.mixed_precision)

    @property
    def checkpoint_mirror_bytes(self):
        """Off TensorFlow, the float32 TensorFlow mirrors of the weights and optimizer slots a
        checkpoint is written from (host memory); none on TensorFlow."""
        if self.backend == "tensorflow":
            return 0
        return sizing.checkpoint_mirror_bytes(self.footprint.parameters, self.optimizer)

    @property
    def checkpoint_copy_bytes(self):
        """What a checkpoint holds on the host beside the step: the memory's global copy and
        the variables' mirrors."""
        return self.checkpoint_memory_bytes + self.checkpoint_mirror_bytes

    def checkpoint_copy_name(self):
        return ("checkpoint copy of the weights, optimizer and memory"
                if self.checkpoint_mirror_bytes else "checkpoint copy of the memory")

    def host_bytes(self, runtime):
        """CPU: what the process needs with `runtime` bytes already resident."""
        return (runtime + self.local_replicas * self.footprint.total
                + self.checkpoint_copy_bytes + sizing.RUN_BYTES)

    def step_line(self):
        """The plan's first line: the model and what one step reads."""
        c, f = self.config, self.footprint
        return (f"plan: {f.parameters:,} parameters ({c.n_layer} layer{'s' * (c.n_layer > 1)}, "
                f"d_model {c.d_model}); "
                f"{self.tokens_per_step:,} tokens per step ({self.global_batch} x tgt_len "
                f"{c.tgt_len}, {sizing.context_text(c)}); {self.replicas_text()}, batch "
                f"{self.per_replica_batch} per replica; {self.mixed_precision}")

    @property
    def device_bytes(self):
        """What one device of a replica holds: the whole replica's estimate, except under
        model_parallel, where the weights, their gradients and the optimizer's slots are split
        over the replica's devices (the activations and the memory are counted whole: an upper
        bound; a compiled step's figure is the whole replica's)."""
        f = self.footprint
        split = 0 if f.compiled else f.weights + f.gradients + f.optimizer + f.gradient_copies
        return f.total - split + -(-split // self.model_axis)

    def replicas_text(self):
        split = (f", each {self.model_axis} devices with its weights split over them"
                 if self.model_axis > 1 else "")
        return f"{self.replicas} replica{'s' * (self.replicas > 1)} ({self.device}{split})"

    def run_size_advice(self):
        """The flags that lower the activations and the memory, with their values."""
        return (f"lower --train_batch_size ({self.global_batch}), --tgt_len "
                f"({self.config.tgt_len}) or --mem_len ({self.config.mem_len}): the attention "
                "grows with batch x tgt_len x (mem_len + tgt_len)")

    def model_size_advice(self):
        """The model's size flags that most of its parameters grow with, with their values (and
        an adaptive embedding where the vocabulary's tables are most of them)."""
        c = self.config
        shares = sizing.size_flag_shares(c)
        named = [f"--{name} ({getattr(c, name)})" for name, share in shares
                 if share >= MODEL_FLAG_SHARE][:4]
        advice = "lower the model's size: " + (", ".join(named[:-1]) + " or " + named[-1]
                                               if len(named) > 1 else named[0])
        tables = 1 - dict(shares)["n_layer"]
        if tables >= 0.5 and c.div_val == 1:
            advice += (f" (the {c.vocab_size:,}-token vocabulary's tables are {tables:.0%} of "
                       "the parameters: --cutoffs with --div_val > 1 shrink them)")
        return advice

    def lowerable_bytes(self):
        """(model, run): the bytes of the memory check's need that only the model's size lowers
        (weights, gradients, optimizer slots, gradient copies) and those the batch, tgt_len and
        mem_len lower (memory state, activations, evaluation memory, the checkpoint copy), each
        with its margin; for a compiled step, its counted items'."""
        f, grow = self.footprint, 1 + sizing.MARGIN
        model = f.weights + f.gradients + f.optimizer + f.gradient_copies
        run = f.memory_state + sum(f.activations.values()) + f.evaluation_memory
        if self.device == "CPU":
            return (int(grow * model) * self.local_replicas + self.checkpoint_mirror_bytes,
                    int(grow * run) * self.local_replicas + self.checkpoint_memory_bytes)
        return int(grow * -(-model // self.model_axis)), int(grow * run)

    def how_to_lower(self, need=None, limit=None):
        """What the refusal advises: the flags of what dominates the estimate `need` over
        `limit` (bytes) — the model's size flags when the weights, gradients and optimizer
        slots do (those alone when no batch would fit), else the batch's, tgt_len and mem_len."""
        run_advice = self.run_size_advice()
        if need is None:
            return run_advice
        model, run = self.lowerable_bytes()
        fixed = need - model - run  # the runtime, the step's program, the run's own
        weights = (f"the weights, gradients and optimizer slots ({self.footprint.parameters:,} "
                   f"parameters) take {_size(model)}")
        if fixed <= limit < fixed + model:
            return f"{weights}, more than fits at any batch: {self.model_size_advice()}"
        if model > run:
            return (f"{weights}, the most of it: {self.model_size_advice()}; or "
                    f"{run_advice}")
        return run_advice

    def lines(self):
        """The plan, a few lines for stdout."""
        f = self.footprint
        items = []
        for name, value in f.items():
            if name == "optimizer":
                name = (f"optimizer ({self.optimizer}: {sizing.OPTIMIZER_SLOTS[self.optimizer]} "
                        "slots)")
            item = f"{name} {_size(value)}"
            if name == "activations":
                item += " (" + ", ".join(f"{k.replace('_', '-')} {_size(v)}"
                                         for k, v in f.activations.items()) + ")"
            items.append(item)
        how = ": XLA's memory_analysis of the compiled step" if f.compiled else ""
        return [self.step_line(),
                f"memory per replica (estimate{how}): {_size(f.total)} = " + " + ".join(items)]

    def check_memory(self, limit=None, ignore=False, runtime=None):
        """A line on the memory the run may use; ValueError when the estimate exceeds it.

        limit: bytes (--memory_limit_gib), else the device's (see the module docstring).
        ignore: say so and return instead of raising. runtime: the resident bytes of the
        process (default: measured now; CPU only).
        """
        lower = self.run_size_advice()
        if self.device == "CPU":
            runtime = resident_bytes() if runtime is None else runtime
            self.runtime = runtime  # before anything is built: what check_compiled counts from
            need = self.host_bytes(runtime)
            limit = host_memory_bytes() if limit is None else limit
            copy = (f" + {_size(self.checkpoint_copy_bytes)} {self.checkpoint_copy_name()}"
                    if self.checkpoint_copy_bytes else "")
            what = (f"{_size(need)} on this host (runtime {_size(runtime)} + "
                    f"{self.local_replicas} x {_size(self.footprint.total)} per replica{copy} + "
                    f"{_size(sizing.RUN_BYTES)} of the run)")
            of = f"its {_size(limit)}"
        else:
            # Whatever the device, a checkpoint is saved from a host copy of the training memory:
            # where the device's memory is not known (TPU) this is what still bounds mem_len.
            runtime = resident_bytes() if runtime is None else runtime
            self.runtime = runtime
            host, host_limit = runtime + self.checkpoint_copy_bytes, host_memory_bytes()
            if host > host_limit:
                what = ("the checkpoint copy of the weights, optimizer and training memory"
                        if self.checkpoint_mirror_bytes else
                        "the checkpoint copy of the training memory")
                message = (f"{what}, {_size(host)} on this "
                           f"host (runtime {_size(runtime)} + "
                           f"{_size(self.checkpoint_copy_bytes)}), exceeds its "
                           f"{_size(host_limit)}; {lower}")
                if ignore:
                    return f"warning: {message}; training anyway (--ignore_memory_estimate)"
                raise ValueError(f"{message}; or pass --ignore_memory_estimate to train anyway")
            need = self.device_bytes
            known = self.device == "GPU" and self.device_memory
            limit = (self.device_memory() if known else None) if limit is None else limit
            if limit is None:
                return (f"memory: not checked ({self.device} memory is not reported by "
                        "TensorFlow; --memory_limit_gib sets it)")
            what = (f"{_size(need)} per replica" if self.model_axis == 1 else
                    f"{_size(need)} per device (a replica's weights split over "
                    f"{self.model_axis})")
            of = f"the {_size(limit)} of each {self.device}"
        if need <= limit:
            return f"memory: {what}, of {of.removeprefix('its ')}"
        message = (f"the estimated memory, {what}, exceeds {of}; "
                   f"{self.how_to_lower(need, limit)}")
        if ignore:
            return f"warning: {message}; training anyway (--ignore_memory_estimate)"
        raise ValueError(f"{message}; or pass --ignore_memory_estimate to train anyway")


class ClassificationPlan(TrainingPlan):
    """What a tfxl-classify-train run will do and need: `TrainingPlan`'s, for a
    `DocumentClassifier` reading documents of `document_tokens` (L, a multiple of tgt_len T) with
    `head` ({num_classes, pooling, grad_segments, ...}). No training memory is carried from step
    to step, so no checkpoint copy of it is made (sizing.classifier_training_footprint)."""

    def __init__(self, config, global_batch, *, head, document_tokens, replicas=1,
                 local_replicas=1, device="CPU", mixed_precision="float32", optimizer="adam",
                 jit_compile=False, device_memory=None, backend="tensorflow"):
        self._set_run(config, global_batch, replicas, local_replicas, device, mixed_precision,
                      optimizer, device_memory=device_memory, backend=backend)
        self.head, self.document_tokens = head, document_tokens
        self.footprint = sizing.classifier_training_footprint(
            config, self.per_replica_batch, num_classes=head["num_classes"],
            pooling=head["pooling"], grad_segments=head["grad_segments"],
            mixed_precision=mixed_precision, optimizer=optimizer, jit_compile=jit_compile,
            backend=backend)

    @classmethod
    def for_strategy(cls, config, strategy, global_batch, mixed_precision, optimizer, *, head,
                     document_tokens, jit_compile=False):
        backend = backends.for_strategy(strategy)
        return cls(config, global_batch, head=head, document_tokens=document_tokens,
                   replicas=backend.replicas, local_replicas=len(backend.local_devices),
                   device=backend.device_kind, mixed_precision=mixed_precision,
                   optimizer=optimizer, jit_compile=jit_compile,
                   device_memory=backend.device_memory_bytes, backend=backend.name)

    @property
    def tokens_per_step(self):
        return self.global_batch * self.document_tokens

    @property
    def checkpoint_memory_bytes(self):
        return 0

    def step_line(self):
        c, f, head = self.config, self.footprint, self.head
        segments = max(-(-self.document_tokens // c.tgt_len), head["grad_segments"])
        return (f"plan: {f.parameters:,} parameters ({c.n_layer} layer{'s' * (c.n_layer > 1)}, "
                f"d_model {c.d_model}, {head['num_classes']} classes, {head['pooling']} "
                f"pooling); {self.global_batch} documents per step of {self.document_tokens:,} "
                f"tokens ({segments} segments of tgt_len {c.tgt_len}, the last "
                f"{head['grad_segments']} with gradient; mem_len {c.mem_len}); "
                f"{self.replicas_text()}, batch {self.per_replica_batch} per replica; "
                f"{self.mixed_precision}")

    def run_size_advice(self):
        return (f"lower --train_batch_size ({self.global_batch}), --grad_segments "
                f"({self.head['grad_segments']}), --tgt_len ({self.config.tgt_len}) or "
                f"--mem_len ({self.config.mem_len}): a step keeps the activations of "
                "grad_segments segments, each growing with batch x tgt_len x "
                "(mem_len + tgt_len)")


def print_plan(plan, limit_gib=None, ignore=False, out=None):
    """Prints `plan` and its memory line to `out` (default: sys.stdout as it is when called);
    raises ValueError when it does not fit."""
    out = sys.stdout if out is None else out
    for line in plan.lines():
        print(line, file=out)
    limit = None if limit_gib is None else int(limit_gib * GIB)
    print(plan.check_memory(limit, ignore), file=out, flush=True)


def check_compiled(plan, peak_bytes, limit_gib=None, ignore=False, out=None):
    """Prints `plan`'s memory again with the compiled step's own figure, `peak_bytes` (JAX's
    `memory_analysis()` of the first host loop, `sizing.compiled_bytes`), in place of the
    counted items, and checks it as `print_plan` did (against the runtime it measured then,
    before the model was built); raises ValueError when it does not fit."""
    out = sys.stdout if out is None else out
    plan.with_compiled(peak_bytes)
    print(plan.lines()[1], file=out)
    limit = None if limit_gib is None else int(limit_gib * GIB)
    print(plan.check_memory(limit, ignore, runtime=plan.runtime), file=out,
          flush=True)


def check_evaluation_memory(config, strategy, global_batch, settings, sources,
                            mixed_precision="float32", limit=None):
    """Raises ValueError, naming the batch and the settings with where each came from, when the
    memory of an evaluation (sizing.evaluation_footprint) exceeds the device's, compared as
    for training (the module docstring): tfxl-eval's check before it builds anything.

    settings: {"tgt_len", "mem_len", ...}; sources: where each comes from ("flag --mem_len",
    "config.json eval_mem_len", ...). limit: bytes, else the device's.
    """
    backend = backends.for_strategy(strategy)
    devices, device = backend.local_devices, backend.device_kind
    per_replica = max(1, global_batch // backend.replicas)
    items = sizing.evaluation_footprint(config, per_replica, settings["tgt_len"],
                                        settings["mem_len"], mixed_precision)
    need = sum(items.values())
    if device == "CPU":
        runtime = resident_bytes()
        need = runtime + len(devices) * need
        limit = host_memory_bytes() if limit is None else limit
        of = f"this host's {_size(limit)} (with the runtime's {_size(runtime)})"
    else:
        limit = (backend.device_memory_bytes() if device == "GPU" else None) if limit is None \
            else limit
        of = f"the {_size(limit or 0)} of each {device}"
    if limit is None or need <= limit:
        return  # fits, or the device's memory is not known (TPU): not checked
    itemised = ", ".join(f"{name} {_size(value)}" for name, value in items.items())
    raise ValueError(
        f"the estimated memory of this evaluation, {_size(need)} ({itemised} per replica), "
        f"exceeds {of}; lower --eval_batch_size ({global_batch}), --tgt_len "
        f"({settings['tgt_len']}, {sources['tgt_len']}) or --mem_len ({settings['mem_len']}, "
        f"{sources['mem_len']}): the attention grows with batch x tgt_len x (mem_len + tgt_len)")
