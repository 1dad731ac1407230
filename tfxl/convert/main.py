r"""tfxl-convert: a published Transformer-XL checkpoint -> a tfxl `.keras` model + config JSON.

    tfxl-convert --format=tf1 --input=pretrained_xl/tf_wt103/model/model.ckpt-0 \
        --preset=wt103_large --output=wt103.keras
    tfxl-convert --format=huggingface --input=transfo-xl-wt103/ --output=wt103.keras
    tfxl-convert --format=pytorch --input=model_state.pt --preset=enwik8_large \
        --vocab_size=204 --output=enwik8.keras

Model hyper-parameters (tfxl.cli.resolve_config, the rule of every tool): --preset, then --config
(JSON, full or partial TransfoXLConfig), then --hf_config (a Hugging Face config.json), then the
override flags (one per TransfoXLConfig field), later ones winning. See docs/convert.md.
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import os
import sys
import time

from absl import flags

from tfxl import cli
from tfxl.convert import (ConversionError, config_overrides_from_hf, config_path_for,
                          convert_checkpoint, describe, save_converted)
from tfxl.deferred import deferred_import
from tfxl.files import read_json

tf = deferred_import("tensorflow")  # imported on first use: --help does not wait for it

FLAGS = flags.FLAGS
TF1_LAYER_NORM_EPSILON = 1e-12  # tf.contrib.layers.layer_norm's variance epsilon


def define_flags():
    flags.DEFINE_enum("format", None, ["pytorch", "huggingface", "tf1"],
                      "Checkpoint family: pytorch (original MemTransformerLM state dict), "
                      "huggingface (TransfoXLLMHeadModel state dict), tf1 (original TF "
                      "checkpoint).")
    flags.DEFINE_string("input", None, "Checkpoint: torch zip .bin/.pt, .safetensors, .npz, a "
                        "TF1 checkpoint prefix (model.ckpt-0) or directory; for huggingface "
                        "also a directory holding model.safetensors/pytorch_model.bin "
                        "(+ config.json).")
    flags.DEFINE_string("output", None, "Output .keras path; the config is written next to it "
                        "as <name>.config.json.")
    flags.DEFINE_bool("overwrite", False, "Replace existing output files.")
    flags.DEFINE_string("hf_config", None, "Hugging Face config.json (huggingface format; found "
                        "automatically next to the weights when --input is a directory).")
    cli.define_config_flags(config_help=" --layer_norm_epsilon defaults to 1e-12 for "
                            "--format=tf1 (tf.contrib.layers.layer_norm).")


def _is_file(path):
    return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)


def resolve_input():
    """(checkpoint path, hf config path or None); any tf.io.gfile path (gs://...)."""
    path, hf_config = FLAGS.input, FLAGS.hf_config
    if FLAGS.format == "huggingface" and tf.io.gfile.isdir(path):
        for name in ("model.safetensors", "pytorch_model.bin"):
            if _is_file(os.path.join(path, name)):
                if hf_config is None and _is_file(os.path.join(path, "config.json")):
                    hf_config = os.path.join(path, "config.json")
                return os.path.join(path, name), hf_config
        raise ValueError(f"{path}: no model.safetensors or pytorch_model.bin in the directory")
    if FLAGS.format != "tf1" and tf.io.gfile.isdir(path):
        raise ValueError(f"--input={path} is a directory; --format={FLAGS.format} reads one file "
                         "(a torch zip .bin/.pt, .safetensors or .npz)")
    if FLAGS.format != "tf1" and not _is_file(path):
        raise ValueError(f"--input={path}: no such file")
    return path, hf_config


def config_from_flags(hf_config_path=None):
    """The TransfoXLConfig of --preset/--config/--hf_config/the override flags."""
    if not (FLAGS.preset or FLAGS.config or hf_config_path):
        raise ValueError("give the model hyper-parameters with --preset, --config or "
                         "--hf_config (PyTorch/TF1 checkpoints do not carry them)")
    sources = []
    if hf_config_path:
        hf = read_json(hf_config_path, "--hf_config")
        sources.append((f"--hf_config={hf_config_path}", config_overrides_from_hf(hf)))
    defaults = {"layer_norm_epsilon": TF1_LAYER_NORM_EPSILON} if FLAGS.format == "tf1" else {}
    config = cli.resolve_config(defaults=defaults, sources=sources)
    cli.check_transformer_xl(config, "tfxl-convert")  # the published checkpoints are
    return config


def main(argv):
    del argv
    for name in ("format", "input", "output"):
        if not FLAGS[name].value:
            raise ValueError(f"--{name} is required")
    if not FLAGS.output.endswith(".keras"):
        raise ValueError(f"--output must end with .keras, got {FLAGS.output!r}")
    if not FLAGS.overwrite:
        for path in (FLAGS.output, config_path_for(FLAGS.output)):
            if tf.io.gfile.exists(path):
                raise ValueError(f"{path} exists (pass --overwrite to replace it)")
    path, hf_config = resolve_input()
    config = config_from_flags(hf_config)
    start = time.time()
    print(f"converting {FLAGS.format} checkpoint {path} with {describe(config)}",
          file=sys.stderr)
    try:
        model = convert_checkpoint(FLAGS.format, path, config)
    except ConversionError as err:
        if FLAGS.verbosity >= 1 and err.details:  # the whole list its error line summarises
            print("\n".join(err.details), file=sys.stderr)
        raise
    keras_path, config_path = save_converted(model, FLAGS.output, overwrite=FLAGS.overwrite)
    n_params = sum(int(w.numpy().size) for w in model.weights)
    print(f"wrote {keras_path} and {config_path} ({n_params:,} parameters, "
          f"{time.time() - start:.1f} s)", file=sys.stderr)
    return 0


def run():
    """Console-script entry point (`tfxl-convert`)."""
    cli.run(main, define_flags)  # ConversionError is a ValueError: one `error:` line


if __name__ == "__main__":
    run()
