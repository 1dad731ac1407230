"""absl flags of `tfxl-train`, `tfxl-eval` and `tfxl-classify-train`, and the model config they
describe."""

import math

from absl import flags

from tfxl import cli
from tfxl.config import NON_NEGATIVE, POSITIVE, PRESETS, field_rules
from tfxl.data.manifest import data_dir_problem

FLAGS = flags.FLAGS

# The range of every numeric flag of tfxl-train, tfxl-eval and tfxl-classify-train, one rule per
# flag name: (holds(value, all values), what the value must be). The model flags' rules are their
# TransfoXLConfig fields' (tfxl/config.py), which a config.json obeys too; tfxl-eval's
# --tgt_len/--mem_len/--clamp_len obey the training fields' rules. check_flag_ranges applies them
# before anything is read or written.
FLAG_RULES = {
    **field_rules(),
    **{name: POSITIVE for name in (
        "train_batch_size", "eval_batch_size", "train_steps", "steps_per_loop",
        "max_eval_batches", "learning_rate", "lease_timeout", "memory_limit_gib",
        "grad_segments", "max_tokens", "model_parallel", "jax_processes",
        "jax_join_timeout")},
    **{name: NON_NEGATIVE for name in (
        "weight_decay", "seed", "num_gpus", "lease_settle", "train_log_seconds", "jax_process_id")},
    "save_every": (lambda v, _: v >= 0, ">= 0 (0: only at the end)"),
    "eval_every": (lambda v, _: v >= 0, ">= 0 (0: never)"),
    "warmup_steps": (lambda v, values: 0 <= v < values["train_steps"], "in [0, --train_steps)"),
    "schedule_steps": (lambda v, values: values.get("warmup_steps", 0) < v < math.inf,
                       "> --warmup_steps"),
    "min_lr_ratio": (lambda v, _: 0 <= v <= 1, "in [0, 1]"),
    "head_dropout": (lambda v, _: 0 <= v < 1, "in [0, 1)"),
    # 0 would not mean "no clipping": clip_by_global_norm(grads, 0) zeroes every gradient.
    "clip": (lambda v, _: 0 < v < math.inf, "> 0"),
}


def check_flag_ranges(values):
    """ValueError naming the first flag in `values` ({name: value}, e.g.
    FLAGS.flag_values_dict()) that breaks its FLAG_RULES rule; None (unset) is not checked."""
    for name, (holds, rule) in FLAG_RULES.items():
        value = values.get(name)
        if value is not None and not holds(value, values):
            raise ValueError(f"--{name}={value} is out of range: it must be {rule}")


def define_model_flags():
    """--preset, --config and one flag per TransfoXLConfig field but vocab_size (the data's)."""
    cli.define_config_flags(preset_default="tiny", exclude=("vocab_size",), config_help=(
        " Its eval_* fields (or the --eval_* flags) are stored in config.json: tfxl-eval's and "
        "tfxl-export's defaults."))


def define_common_flags(training=True):
    """The flags tfxl-train and tfxl-eval share; `training` False: tfxl-eval's, in its words."""
    flags.DEFINE_string("data_dir", None, "Directory written by tfxl-prepare.")
    flags.DEFINE_string("model_dir", None, "Checkpoints, config.json, TensorBoard logs, metrics."
                        if training else "A tfxl-train model_dir: its config.json and "
                        "checkpoints.")
    flags.DEFINE_integer("max_eval_batches", None, "Evaluate at most this many batches "
                         "(default: the whole split, every token once).")
    define_step_flags(training)


def define_step_flags(training=True):
    """How a step computes: --mixed_precision, --jit_compile and, for training, --seed (an
    evaluation draws nothing: no dropout, no initialisation)."""
    flags.DEFINE_enum("mixed_precision", "float32",
                      ["float32", "mixed_bfloat16", "mixed_float16"], "Keras dtype policy.")
    flags.DEFINE_bool("jit_compile", False, "XLA-compile the forward/backward step."
                      if training else "XLA-compile the evaluation's forward pass.")
    if training:
        flags.DEFINE_integer("seed", 0, "Random seed (weights, dropout).")


def define_training_flags(rows="streams"):
    """The run's length and cadence, the optimizer and its schedule (tfxl-train's and
    tfxl-classify-train's, whose batch `rows` are documents): `optimizer_params` reads them."""
    flags.DEFINE_integer("train_batch_size", 16, f"Global batch size ({rows} per step).")
    flags.DEFINE_integer("train_steps", 1000, "Total optimisation steps.")
    flags.DEFINE_integer("steps_per_loop", 100, "Steps per tf.function call (host loop).")
    flags.DEFINE_bool("short_first_loops", True, "The first host loops end 1, 2, 4, ... steps "
                      "in, so that progress shows from the first step (on JAX, where each loop "
                      "length compiles once: one loop of 1 step).")
    flags.DEFINE_integer("save_every", 500, "Checkpoint every this many steps (and at the end).")
    flags.DEFINE_float("learning_rate", 2.5e-4, "Peak learning rate.")
    flags.DEFINE_integer("warmup_steps", 0, "Linear warm-up steps.")
    flags.DEFINE_float("min_lr_ratio", 0.004, "Cosine decay ends at learning_rate * this.")
    flags.DEFINE_float("clip", 0.25, "Global-norm gradient clipping.")
    flags.DEFINE_enum("optimizer", "adam", ["adam", "adamw", "lamb"], "Keras optimizer.")
    flags.DEFINE_float("weight_decay", 0.0, "Weight decay for adamw/lamb.")


# --help headings both training tools share (each tool lists its other flags under its own).
TRAINING_HELP_GROUP = ("training", [
    "train_batch_size", "train_steps", "steps_per_loop", "short_first_loops", "learning_rate",
    "warmup_steps", "min_lr_ratio", "schedule_steps", "clip", "optimizer", "weight_decay",
    "mixed_precision", "jit_compile", "seed"])
DEVICES_HELP_GROUP = ("devices", ["strategy", "tpu", "num_gpus"])
RUN_MANAGEMENT_FLAGS = ["allow_run_changes", "take_over", "lease_timeout", "lease_settle",
                        "train_log_seconds"]


def optimizer_params(flag_values=FLAGS):
    """The `OptimizerParams` of define_training_flags' flags (and --schedule_steps)."""
    from tfxl.train.loop.optimization import OptimizerParams  # loads Keras: the tool has by now
    fv = flag_values
    return OptimizerParams(fv.learning_rate, fv.warmup_steps, fv.min_lr_ratio, fv.train_steps,
                           fv.clip, fv.optimizer, fv.weight_decay, fv.schedule_steps)


def run_options(*, is_chief, flag_values=FLAGS, **overrides):
    """The `RunOptions` the training tools' flags give (tfxl-train, tfxl-classify-train);
    `overrides` sets the others."""
    from tfxl.train.records import lease
    from tfxl.train.loop.run import RunOptions  # loads TensorFlow: the tool has by now
    fv = flag_values
    return RunOptions(
        model_dir=fv.model_dir, global_batch=fv.train_batch_size,
        optimizer=optimizer_params(fv), mixed_precision=fv.mixed_precision,
        jit_compile=fv.jit_compile, steps_per_loop=fv.steps_per_loop, seed=fv.seed,
        is_chief=is_chief, allow_run_changes=fv.allow_run_changes,
        lease=lease.params_from_flags(fv), train_log_seconds=fv.train_log_seconds,
        short_first_loops=fv.short_first_loops, **overrides)


def model_config(vocab_size, cutoffs=None, flag_values=FLAGS):
    """The TransfoXLConfig of --preset, --config and the override flags (tfxl.cli.resolve_config),
    with the data's vocabulary.

    vocab_size comes from the data manifest: a model must match the data it is trained on. The
    preset's cutoffs are kept when they fit the vocabulary, otherwise the manifest's suggested
    `cutoffs` are used; --config's and --cutoffs win over both.
    """
    preset_cutoffs = PRESETS[flag_values.preset].get("cutoffs", ()) if flag_values.preset else ()
    defaults = {}
    if cutoffs is not None and not all(c < vocab_size for c in preset_cutoffs):
        defaults["cutoffs"] = tuple(int(c) for c in cutoffs)
    return cli.resolve_config(flag_values, defaults=defaults,
                              fixed={"vocab_size": int(vocab_size)})


def require_dir_flags(*names, flag_values=FLAGS):
    for name in names:
        if not flag_values[name].value:
            raise ValueError(f"--{name} is required")
    problem = "data_dir" in names and data_dir_problem(flag_values.data_dir)
    if problem:
        raise ValueError(f"--data_dir={flag_values.data_dir} {problem}")
