r"""`tfxl-train`: train a Transformer-XL language model (or, with --architecture, one of the
paper's baselines: docs/baselines.md) on a tfxl-prepare data directory.

    tfxl-train --data_dir=data/stdlib --model_dir=runs/tiny --preset=tiny \
        --train_batch_size=16 --train_steps=2000 --steps_per_loop=100 --strategy=mirrored

See BUILD.md for TPU pods and multi-worker runs.
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import functools

from absl import flags

from tfxl import cli
from tfxl.checkpoints import warm_start
from tfxl.tpu import StrategyError, define_flags as define_strategy_flags
from tfxl.tpu import jax_mesh
from tfxl.train import backends
from tfxl.train import flags as train_flags
from tfxl.train.records import lease
from tfxl.train.records import run_record
from tfxl.train.records import train_log
from tfxl.train.planning import plan as training_plan

FLAGS = flags.FLAGS


def define_flags():
    train_flags.define_model_flags()
    train_flags.define_common_flags()
    define_strategy_flags()
    jax_mesh.define_flags()  # --model_parallel, --jax_coordinator, ...
    train_flags.define_training_flags()
    flags.DEFINE_integer("eval_every", 0, "Evaluate on valid every this many steps (0: never), "
                         "with the evaluation settings (--eval_tgt_len etc., else the preset's).")
    run_record.define_flags()  # --schedule_steps, --allow_run_changes
    lease.define_flags()  # --take_over, --lease_timeout, --lease_settle
    train_log.define_flags()  # --train_log_seconds
    training_plan.define_flags()
    warm_start.define_flags()


def run_strategy(config):
    """The strategy of the backend Keras runs on: tf.distribute's on TensorFlow, Keras'
    distribution API on JAX (the model's layout map for model_parallel)."""
    from tfxl.models import language_model_class
    return backends.strategy_from_flags(
        jax_layout_map=lambda mesh: language_model_class(config).get_layout_map(config, mesh),
        mixed_precision=FLAGS.mixed_precision)


def main(argv):
    del argv
    # Here, not at the top: --help, which defines the flags only, loads no TensorFlow.
    from tfxl.data.manifest import check_manifest, load_manifest
    from tfxl.model_dir import check_or_store_config
    from tfxl.train.tasks.language_model import LanguageModelTask, build_model
    from tfxl.train.loop.run import TrainingRun, train_from_command_line
    train_flags.check_flag_ranges(FLAGS.flag_values_dict())
    train_flags.require_dir_flags("data_dir", "model_dir")
    manifest = load_manifest(FLAGS.data_dir)
    config = train_flags.model_config(manifest["vocab_size"], manifest.get("cutoffs"))
    strategy = run_strategy(config)
    # Before anything is built: the same initial weights and dropout stream every run.
    backends.configure_process(mixed_precision=FLAGS.mixed_precision, seed=FLAGS.seed)
    chief = backends.for_strategy(strategy).is_chief
    if chief:
        check_or_store_config(FLAGS.model_dir, config, store=False)
    # The data checks of the first step, here too so that a dry run makes them.
    check_manifest(manifest, tgt_len=config.tgt_len, global_batch_size=FLAGS.train_batch_size)
    plan = training_plan.TrainingPlan.for_strategy(
        config, strategy, FLAGS.train_batch_size, FLAGS.mixed_precision, FLAGS.optimizer,
        evaluates=bool(FLAGS.eval_every), jit_compile=FLAGS.jit_compile)
    training_plan.print_plan(plan, FLAGS.memory_limit_gib, FLAGS.ignore_memory_estimate)
    if FLAGS.dry_run:
        if FLAGS.init_checkpoint:  # its weights are read only by the run itself
            warm_start.warm_start(FLAGS.init_checkpoint, build_model(config, strategy),
                                  FLAGS.model_dir, manifest, FLAGS.data_dir, load=False)
        print("dry run: nothing written")
        return 0
    options = train_flags.run_options(is_chief=chief)
    # The warm start is checked and loaded as the run is built, before the model_dir is
    # claimed: a source that does not fit leaves nothing there.
    task = LanguageModelTask(config, data_dir=FLAGS.data_dir,
                             init_checkpoint=FLAGS.init_checkpoint)
    run = TrainingRun(task, strategy=strategy, options=options)
    metrics, status = train_from_command_line(
        run, FLAGS.train_steps, save_every=FLAGS.save_every, eval_every=FLAGS.eval_every,
        max_eval_batches=FLAGS.max_eval_batches, log=cli.note,
        check_compiled=functools.partial(training_plan.check_compiled, plan,
                                         limit_gib=FLAGS.memory_limit_gib,
                                         ignore=FLAGS.ignore_memory_estimate))
    if metrics is None:
        return status
    print(f"done: step {metrics['step']}, train loss {metrics['train_loss']}")
    return 0


def help_groups():
    """tfxl-train --help's headings and the flags under each (a new flag of tfxl-train's belongs
    in one: tests/test_cli_help.py checks that none is left over)."""
    model = cli.model_flag_names(exclude=("vocab_size",))
    evaluation = [name for name in model if name.startswith("eval_")]
    return [
        ("data and model_dir", ["data_dir", "model_dir"]),
        ("model (--preset, then the --config JSON, then these flags; vocab_size is the data's)",
         [name for name in model if name not in evaluation]),
        train_flags.TRAINING_HELP_GROUP,
        ("evaluation (the eval_* settings are stored in config.json for tfxl-eval and "
         "tfxl-export)", ["eval_every", "max_eval_batches", *evaluation]),
        ("checkpoints and warm start", ["save_every", "init_checkpoint"]),
        (train_flags.DEVICES_HELP_GROUP[0], [*train_flags.DEVICES_HELP_GROUP[1],
                                             *jax_mesh.FLAG_NAMES]),
        ("run management", ["dry_run", "memory_limit_gib", "ignore_memory_estimate",
                            *train_flags.RUN_MANAGEMENT_FLAGS]),
    ]


def failures():
    """A diverged run is not the user's input: its own status, 3 (the last good checkpoint
    kept). Looked up only when a run raised (tfxl.cli.run): the trainer loads TensorFlow."""
    from tfxl.train.loop.run import TrainingDiverged
    return {TrainingDiverged: 3}


def run():
    cli.run(main, define_flags, errors=(StrategyError,), failures=failures,
            help_groups=help_groups())


if __name__ == "__main__":
    run()
