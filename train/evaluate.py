"""`tfxl-eval`: token-weighted loss, bpc or perplexity of a trained model over a whole split.

    tfxl-eval --data_dir=data/stdlib --model_dir=runs/tiny --split=test \
        --tgt_len=32 --mem_len=256 --clamp_len=-1 --same_length

Evaluation settings default to the preset's (the paper's longer memory); the model comes from
`model_dir/config.json` and its latest checkpoint (or --checkpoint).
"""

import json
import os

from absl import flags

from tfxl import cli
from tfxl.config import TransfoXLConfig
from tfxl.data.manifest import load_manifest
from tpu import StrategyError, define_flags as define_strategy_flags, strategy_from_flags
from train import flags as train_flags
from train.loop import Runner, write_json_atomically
from train.model_fn import OptimizerParams

FLAGS = flags.FLAGS


def define_flags():
    train_flags.define_common_flags()
    define_strategy_flags()
    flags.DEFINE_string("checkpoint", None, "Checkpoint path (default: latest in model_dir).")
    flags.DEFINE_enum("split", "valid", ["train", "valid", "test"], "Split to evaluate.")
    flags.DEFINE_integer("eval_batch_size", None, "Global batch (default: the data's "
                         "num_streams, so every stream is one batch row).")
    flags.DEFINE_integer("tgt_len", None, "Segment length (default: config eval_tgt_len).")
    flags.DEFINE_integer("mem_len", None, "Memory length (default: config eval_mem_len).")
    flags.DEFINE_integer("clamp_len", None, "Clamp distances (default: config eval_clamp_len).")
    flags.DEFINE_bool("same_length", None, "Same attention length (default: config).")
    flags.DEFINE_string("output", None, "Also write the result as JSON to this file.")


def evaluate_from_flags():
    train_flags.require_dir_flags("data_dir", "model_dir")
    if FLAGS.output:  # checked first: never evaluate for minutes and then fail to write
        parent = os.path.dirname(os.path.abspath(FLAGS.output))
        if not os.path.isdir(parent):
            raise ValueError(f"--output={FLAGS.output}: directory {parent} does not exist")
    config = TransfoXLConfig.from_file(os.path.join(FLAGS.model_dir, "config.json"))
    settings = config.eval_settings()
    pick = lambda flag, key: settings[key] if flag is None else flag  # noqa: E731
    strategy = strategy_from_flags()
    streams = load_manifest(FLAGS.data_dir)["num_streams"]
    batch = streams if FLAGS.eval_batch_size is None else FLAGS.eval_batch_size
    runner = Runner(config, strategy, FLAGS.data_dir, FLAGS.model_dir, batch,
                    OptimizerParams(), FLAGS.mixed_precision, FLAGS.jit_compile,
                    steps_per_loop=100)
    used = runner.restore_weights_only(FLAGS.checkpoint)
    result = runner.evaluate(FLAGS.split, batch, pick(FLAGS.tgt_len, "tgt_len"),
                             pick(FLAGS.mem_len, "mem_len"), pick(FLAGS.clamp_len, "clamp_len"),
                             pick(FLAGS.same_length, "same_length"), FLAGS.max_eval_batches)
    result["checkpoint"] = used
    return result


def main(argv):
    del argv
    result = evaluate_from_flags()
    print(json.dumps(result, sort_keys=True))
    if FLAGS.output:
        write_json_atomically(FLAGS.output, result)
    return 0


def run():
    cli.run(main, define_flags, errors=(StrategyError,))


if __name__ == "__main__":
    run()
