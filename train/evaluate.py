r"""`tfxl-eval`: token-weighted loss, bpc or perplexity of a trained model over a whole split.

    tfxl-eval --data_dir=data/stdlib --model_dir=runs/tiny --split=test \
        --tgt_len=32 --mem_len=256 --clamp_len=-1 --same_length

Each evaluation setting comes from its flag, else config.json's eval_* (the preset's, or
tfxl-train's --eval_*), else the training value; which one is printed to stderr and returned in
the result's "settings_from". The model comes from `model_dir/config.json` and its newest
readable checkpoint (or --checkpoint). stdout carries only the result as one JSON line.
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import sys

from absl import flags

from tfxl import cli
from tfxl.checkpoints.tree import restore_weights
from tfxl.config import TransfoXLConfig
from tfxl.data.manifest import load_manifest, split_info
from tfxl.model_dir import LANGUAGE_MODEL, ModelDir, check_run_kind
from tfxl.tpu import StrategyError, define_flags as define_strategy_flags
from tfxl.train import backends, flags as train_flags
from tfxl.files import check_writable
from tfxl.train.planning.plan import check_evaluation_memory

FLAGS = flags.FLAGS


def define_flags():
    train_flags.define_common_flags(training=False)
    define_strategy_flags()
    flags.DEFINE_string("checkpoint", None, "Checkpoint path (default: latest in model_dir).")
    flags.DEFINE_enum("split", "valid", ["train", "valid", "test"], "Split to evaluate.")
    flags.DEFINE_integer("eval_batch_size", None, "Global batch (default: the data's "
                         "num_streams, so every stream is one batch row).")
    cli.define_eval_flags()
    flags.DEFINE_string("output", None, "Also write the result as JSON to this file.")
    flags.DEFINE_boolean("loss_by_position", False, "Also return \"loss_by_position\": the "
                         "mean loss at each position 0..tgt_len-1 of the evaluation segments "
                         "(without memory it falls along the segment).")


def warn(message):
    print(message, file=sys.stderr)  # stdout carries only the result's JSON line


def evaluation_settings(config):
    """tgt_len/mem_len/clamp_len/same_length and where each comes from: the tfxl-eval flag, else
    config.json's eval_* (the preset's or tfxl-train's --eval_*), else the training value
    (TransfoXLConfig.eval_settings's rule)."""
    resolved = config.eval_settings_sources(**cli.eval_overrides())
    settings = {key: value for key, (value, _) in resolved.items()}
    sources = {key: f"flag --{key}" if source == "argument" else f"config.json {source}"
               for key, (_, source) in resolved.items()}
    return settings, sources


def evaluate_from_flags():
    # Here, not at the top: --help, which defines the flags only, loads no Keras.
    from tfxl.train.tasks.language_model import make_evaluator
    train_flags.check_flag_ranges(FLAGS.flag_values_dict())
    train_flags.require_dir_flags("data_dir", "model_dir")
    if FLAGS.output:  # checked first: never evaluate for minutes and then fail to write
        check_writable(FLAGS.output, "--output")  # local or a bucket (tf.io.gfile)
    import tensorflow as tf
    if not tf.io.gfile.exists(FLAGS.model_dir):  # as tfxl-train names a missing --data_dir
        raise ValueError(f"--model_dir={FLAGS.model_dir} does not exist; give the --model_dir "
                         "of a tfxl-train run")
    # Before config.json is read: a classifier's would be refused for a setting that is not why.
    check_run_kind(FLAGS.model_dir, LANGUAGE_MODEL, "evaluate it with tfxl-classify-eval "
                   f"--model={FLAGS.model_dir}", flag="--model_dir")
    config = TransfoXLConfig.from_file(ModelDir(FLAGS.model_dir).config)
    settings, sources = evaluation_settings(config)
    warn("evaluating with " + ", ".join(f"{key}={value} ({sources[key]})"
                                        for key, value in settings.items()))
    strategy = backends.strategy_from_flags()
    backends.configure_process(mixed_precision=FLAGS.mixed_precision, seed=0)
    manifest = load_manifest(FLAGS.data_dir)
    batch = manifest["num_streams"] if FLAGS.eval_batch_size is None else FLAGS.eval_batch_size
    # Before the model is built: a size no machine holds is named, not an OOM deep inside.
    check_evaluation_memory(config, strategy, batch, settings, sources, FLAGS.mixed_precision)
    evaluator = make_evaluator(config, strategy, FLAGS.data_dir, FLAGS.model_dir, batch,
                               FLAGS.mixed_precision, FLAGS.jit_compile)
    used = restore_weights(evaluator.model, FLAGS.checkpoint,
                           ModelDir(FLAGS.model_dir).checkpoints, log=warn)
    result = evaluator.evaluate(FLAGS.split, batch, max_batches=FLAGS.max_eval_batches,
                                by_position=FLAGS.loss_by_position, **settings)
    result["checkpoint"] = used
    # --max_eval_batches cut it short: its numbers are not the split's.
    result["partial"] = result["tokens"] < split_info(manifest, FLAGS.split)["tokens"]
    result["settings_from"] = sources
    return result


def main(argv):
    del argv
    result = evaluate_from_flags()
    cli.print_result(result, FLAGS.output)
    return 0


def run():
    cli.run(main, define_flags, errors=(StrategyError,))


if __name__ == "__main__":
    run()
