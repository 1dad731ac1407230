"""tfxl-convert: a published Transformer-XL checkpoint -> a tfxl `.keras` model + config JSON.

    tfxl-convert --format=tf1 --input=pretrained_xl/tf_wt103/model/model.ckpt-0 \
        --preset=wt103_large --output=wt103.keras
    tfxl-convert --format=huggingface --input=transfo-xl-wt103/ --output=wt103.keras
    tfxl-convert --format=pytorch --input=model_state.pt --preset=enwik8_large \
        --vocab_size=204 --output=enwik8.keras

Model hyper-parameters: --preset, then --config (JSON, full or partial TransfoXLConfig), then
--hf_config (a Hugging Face config.json), then the explicit override flags, later ones winning.
Bad input prints one `error: ...` line and exits with status 2. See docs/convert.md.
"""

from __future__ import annotations

import json
import os
import sys
import time

_OVERRIDES_INT = ("vocab_size", "n_layer", "d_model", "n_head", "d_head", "d_inner", "d_embed",
                  "div_val", "tgt_len", "mem_len", "clamp_len", "eval_tgt_len", "eval_mem_len",
                  "eval_clamp_len")
_OVERRIDES_BOOL = ("tie_weight", "proj_same_dim", "untie_r", "pre_lnorm", "same_length",
                   "eval_same_length")
TF1_LAYER_NORM_EPSILON = 1e-12  # tf.contrib.layers.layer_norm's variance epsilon


def define_flags(flag_values=None):
    """Registers the tfxl-convert flags (only when the CLI runs, never on import)."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    from tfxl.config import PRESETS  # pylint: disable=import-outside-toplevel

    fv = flag_values if flag_values is not None else flags.FLAGS
    flags.DEFINE_enum("format", None, ["pytorch", "huggingface", "tf1"],
                      "Checkpoint family: pytorch (original MemTransformerLM state dict), "
                      "huggingface (TransfoXLLMHeadModel state dict), tf1 (original TF "
                      "checkpoint).", flag_values=fv)
    flags.DEFINE_string("input", None, "Checkpoint: torch zip .bin/.pt, .safetensors, .npz, a "
                        "TF1 checkpoint prefix (model.ckpt-0) or directory; for huggingface "
                        "also a directory holding model.safetensors/pytorch_model.bin "
                        "(+ config.json).", flag_values=fv)
    flags.DEFINE_string("output", None, "Output .keras path; the config is written next to it "
                        "as <name>.config.json.", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace existing output files.", flag_values=fv)
    flags.DEFINE_enum("preset", None, sorted(PRESETS), "Base hyper-parameters (tfxl.PRESETS).",
                      flag_values=fv)
    flags.DEFINE_string("config", None, "JSON file of TransfoXLConfig fields, applied on top "
                        "of --preset.", flag_values=fv)
    flags.DEFINE_string("hf_config", None, "Hugging Face config.json (huggingface format; found "
                        "automatically next to the weights when --input is a directory).",
                        flag_values=fv)
    for name in _OVERRIDES_INT:
        flags.DEFINE_integer(name, None, f"Override TransfoXLConfig.{name}.", flag_values=fv)
    for name in _OVERRIDES_BOOL:
        flags.DEFINE_bool(name, None, f"Override TransfoXLConfig.{name}.", flag_values=fv)
    flags.DEFINE_float("layer_norm_epsilon", None, "Override the LayerNorm epsilon (default "
                       "1e-5; 1e-12 for --format=tf1, as tf.contrib.layers.layer_norm).",
                       flag_values=fv)
    flags.DEFINE_list("cutoffs", None, "Override the adaptive softmax cutoffs (comma-separated; "
                      "empty for none).", flag_values=fv)
    flags.DEFINE_list("tie_projs", None, "Override tie_projs: one true/false per cluster, "
                      "shortlist first.", flag_values=fv)


class UsageError(ValueError):
    pass


def _parse_bool(text):
    t = str(text).strip().lower()
    if t in ("1", "true", "t", "yes", "y"):
        return True
    if t in ("0", "false", "f", "no", "n"):
        return False
    raise UsageError(f"--tie_projs: {text!r} is not true/false")


def _read_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise UsageError(f"{what} {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} {path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{what} {path}: expected a JSON object")
    return data


def resolve_input(fv):
    """(checkpoint path, hf config path or None)."""
    path, hf_config = fv.input, fv.hf_config
    if fv.format == "huggingface" and os.path.isdir(path):
        for name in ("model.safetensors", "pytorch_model.bin"):
            if os.path.isfile(os.path.join(path, name)):
                if hf_config is None and os.path.isfile(os.path.join(path, "config.json")):
                    hf_config = os.path.join(path, "config.json")
                return os.path.join(path, name), hf_config
        raise UsageError(f"{path}: no model.safetensors or pytorch_model.bin in the directory")
    if fv.format != "tf1" and not os.path.isfile(path):
        raise UsageError(f"--input {path}: no such file")
    return path, hf_config


def config_from_flags(fv, hf_config_path=None):
    """The TransfoXLConfig described by --preset/--config/--hf_config/overrides."""
    from tfxl.config import PRESETS, TransfoXLConfig  # pylint: disable=import-outside-toplevel
    from tfxl.convert import config_overrides_from_hf  # pylint: disable=import-outside-toplevel

    fields = {}
    explicit = set()
    if fv.preset:
        fields.update(PRESETS[fv.preset])
    if fv.config:
        data = _read_json(fv.config, "--config")
        fields.update(data)
        explicit |= set(data)
    if hf_config_path:
        fields.update(config_overrides_from_hf(_read_json(hf_config_path, "--hf_config")))
    if not (fv.preset or fv.config or hf_config_path):
        raise UsageError("give the model hyper-parameters with --preset, --config or "
                         "--hf_config (PyTorch/TF1 checkpoints do not carry them)")
    for name in _OVERRIDES_INT + _OVERRIDES_BOOL + ("layer_norm_epsilon",):
        value = getattr(fv, name)
        if value is not None:
            fields[name] = value
            explicit.add(name)
    if fv.cutoffs is not None:
        try:
            fields["cutoffs"] = tuple(int(c) for c in fv.cutoffs if c.strip())
        except ValueError:
            raise UsageError(f"--cutoffs: not integers: {','.join(fv.cutoffs)}") from None
    if fv.tie_projs is not None:
        fields["tie_projs"] = tuple(_parse_bool(t) for t in fv.tie_projs if t.strip())
    if fv.format == "tf1" and "layer_norm_epsilon" not in explicit:
        fields["layer_norm_epsilon"] = TF1_LAYER_NORM_EPSILON
    # A preset's tie_projs was written for its own cutoffs: drop it when the cutoffs changed.
    if ("tie_projs" in fields and fields["tie_projs"] is not None and "tie_projs" not in explicit
            and fv.tie_projs is None
            and len(fields["tie_projs"]) != len(tuple(fields.get("cutoffs", ()))) + 1):
        fields["tie_projs"] = None
    return TransfoXLConfig.from_dict(fields)


def main_with_flags(fv, argv=()) -> int:
    """Runs the conversion from parsed flags; returns the exit code (2 on bad input)."""
    from tfxl.convert import (ConversionError, convert_checkpoint,  # pylint: disable=C0415
                              describe, save_converted)
    from tfxl.convert.errors import one_line  # pylint: disable=import-outside-toplevel

    def fail(message):
        print(f"error: {one_line(message)}", file=sys.stderr)
        return 2

    if len(argv) > 1:
        return fail(f"unexpected arguments: {' '.join(argv[1:])}")
    for name in ("format", "input", "output"):
        if not getattr(fv, name):
            return fail(f"--{name} is required")
    try:
        if not fv.output.endswith(".keras"):
            raise UsageError(f"--output must end with .keras, got {fv.output!r}")
        from tfxl.convert import config_path_for  # pylint: disable=import-outside-toplevel
        if not fv.overwrite:
            for path in (fv.output, config_path_for(fv.output)):
                if os.path.exists(path):
                    raise UsageError(f"{path} exists (pass --overwrite to replace it)")
        path, hf_config = resolve_input(fv)
        config = config_from_flags(fv, hf_config)
        start = time.time()
        print(f"converting {fv.format} checkpoint {path} with {describe(config)}",
              file=sys.stderr)
        model = convert_checkpoint(fv.format, path, config)
        keras_path, config_path = save_converted(model, fv.output, overwrite=fv.overwrite)
    except (UsageError, ConversionError) as e:
        return fail(str(e))
    except ValueError as e:  # TransfoXLConfig.validate and friends
        return fail(str(e))
    except OSError as e:
        return fail(f"{getattr(e, 'filename', '') or ''} {e.strerror or e}")
    n_params = sum(int(w.numpy().size) for w in model.weights)
    print(f"wrote {keras_path} and {config_path} ({n_params:,} parameters, "
          f"{time.time() - start:.1f} s)", file=sys.stderr)
    return 0


def main(argv):
    from absl import flags  # pylint: disable=import-outside-toplevel
    return main_with_flags(flags.FLAGS, argv)


def run():
    """Console-script entry point (`tfxl-convert`)."""
    from tfxl import cli  # pylint: disable=import-outside-toplevel
    cli.run(main, define_flags)


if __name__ == "__main__":
    run()
