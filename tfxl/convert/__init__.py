"""Convert the published Transformer-XL checkpoints into `tfxl.TransfoXLLM`.

    from tfxl.convert import convert_checkpoint, save_converted
    model = convert_checkpoint("tf1", "model.ckpt-0", tfxl.get_preset("wt103_large"))
    save_converted(model, "wt103.keras")

Formats: "pytorch" (original `MemTransformerLM` state dict), "huggingface"
(`TransfoXLLMHeadModel` state dict, `.bin` or `.safetensors`), "tf1" (original TF checkpoint).
No torch import anywhere: torch zip files are read by a restricted unpickler (see `readers`);
`.safetensors` files need the `safetensors` package (the `convert` extra: `pip install
'.[convert]'` in a clone of tfxl).
See docs/convert.md.
"""

from __future__ import annotations

import json
import os

import numpy as np

from tfxl.convert.errors import ConversionError
from tfxl.convert.mapping import FORMATS, make_plan
from tfxl.convert.readers import TensorSource, open_checkpoint
from tfxl.deferred import deferred_import
from tfxl.files import StagedDirectory, is_local, write_text_atomically

# TensorFlow and the model are imported on first use: tfxl-convert's --help reads this package
# for its flags and should not wait for them (tests/test_cli_help.py).
tf = deferred_import("tensorflow")

__all__ = [
    "ConversionError", "FORMATS", "TensorSource", "open_checkpoint", "check_checkpoint",
    "convert_checkpoint", "save_converted", "config_overrides_from_hf", "memory_from_time_major",
    "config_path_for",
]


def _as_source(checkpoint, fmt):
    if isinstance(checkpoint, TensorSource):
        return checkpoint
    if isinstance(checkpoint, dict):
        return TensorSource.from_arrays(checkpoint, "state dict")
    kind = "tf1" if fmt == "tf1" else "auto"
    return open_checkpoint(checkpoint, kind)


def check_checkpoint(fmt, checkpoint, config):
    """Raises `ConversionError` listing every missing/unknown/mis-shaped tensor (loads nothing)."""
    plan = make_plan(fmt, _as_source(checkpoint, fmt), config)
    plan.check()
    return plan


def convert_checkpoint(fmt, checkpoint, config):
    """A built `TransfoXLLM` holding the checkpoint's weights.

    Args:
      fmt: "pytorch" | "huggingface" | "tf1".
      checkpoint: a path (torch zip `.bin/.pt`, `.safetensors`, `.npz`, or a TF1 checkpoint
        prefix/directory), a `TensorSource`, or a dict name -> numpy array.
      config: the `tfxl.TransfoXLConfig` the checkpoint was trained with (the PyTorch and TF1
        files carry no hyper-parameters).
    """
    from tfxl.models import TransfoXLLM

    plan = check_checkpoint(fmt, checkpoint, config)
    model = TransfoXLLM(config)
    model.build((None, config.tgt_len))
    plan.apply(model)
    return model


def config_path_for(output):
    """`model.keras` -> `model.config.json`."""
    output = os.fspath(output)
    base = output[: -len(".keras")] if output.endswith(".keras") else output
    return base + ".config.json"


def save_converted(model, output, overwrite=False):
    """Writes `output` (.keras) and its config JSON next to it; returns both paths.

    Any tf.io.gfile path (gs://...). Refuses to replace existing files unless `overwrite`; a
    failure never leaves a half-written file under either name: each is published whole
    (`tfxl.files.StagedDirectory.publish_file`, `write_text_atomically`). The files get the
    ordinary permissions (umask), readable by others.
    """
    output = os.fspath(output)
    if not output.endswith(".keras"):
        raise ConversionError(f"--output must end with .keras, got {output!r}")
    config_path = config_path_for(output)
    if not overwrite:
        for path in (output, config_path):
            if tf.io.gfile.exists(path):
                raise ConversionError(f"{path} exists (pass --overwrite to replace it)")
    if is_local(output):
        directory = os.path.dirname(output if "://" in output else os.path.abspath(output))
        if not tf.io.gfile.isdir(directory):
            raise ConversionError(f"output directory {directory} does not exist")
    # A .keras file is a zip archive Keras writes piece by piece: built in scratch, published
    # whole; its config first, so that a reader who finds the model finds its config.
    with StagedDirectory(output, "convert", scratch="tfxl-convert-") as staged:
        model.save(os.path.join(staged.path, "model.keras"), overwrite=True)
        write_text_atomically(config_path, model.config.to_json() + "\n")
        staged.publish_file("model.keras")
    return output, config_path


# Hugging Face config.json -> TransfoXLConfig fields.
_HF_DIRECT = ("vocab_size", "n_layer", "d_model", "n_head", "d_head", "d_inner", "d_embed",
              "div_val", "pre_lnorm", "untie_r", "dropout", "dropatt", "init_std",
              "proj_init_std", "layer_norm_epsilon", "tgt_len", "mem_len", "same_length")


def config_overrides_from_hf(hf):
    """TransfoXLConfig overrides from a Hugging Face `config.json` dict.

    `proj_share_all_but_first` becomes `tie_projs`; `tie_word_embeddings` (or the older
    `tie_weight`) becomes `tie_weight`; HF's clamp_len <= 0 means "no clamp" (-1 here).
    HF's mem_len/clamp_len/same_length are its evaluation settings and also set the eval_*
    fields. Raises `ConversionError` for settings tfxl cannot represent.
    """
    if hf.get("attn_type", 0) != 0:
        raise ConversionError(f"Hugging Face attn_type={hf['attn_type']} is not supported "
                              f"(only 0, relative partial-learnable attention)")
    if hf.get("sample_softmax", -1) > 0:
        raise ConversionError("Hugging Face sample_softmax > 0 is not supported")
    aliases = {"n_token": "vocab_size", "hidden_size": "d_model", "num_attention_heads": "n_head",
               "num_hidden_layers": "n_layer"}
    hf = {aliases.get(k, k): v for k, v in hf.items()}
    out = {k: hf[k] for k in _HF_DIRECT if k in hf and hf[k] is not None}
    if "cutoffs" in hf:
        out["cutoffs"] = tuple(int(x) for x in hf["cutoffs"])
    if "clamp_len" in hf:
        out["clamp_len"] = int(hf["clamp_len"]) if int(hf["clamp_len"]) > 0 else -1
    tie = hf.get("tie_word_embeddings", hf.get("tie_weight"))
    if tie is not None:
        out["tie_weight"] = bool(tie)
    if "tie_projs" in hf and hf["tie_projs"] is not None:
        out["tie_projs"] = tuple(bool(t) for t in hf["tie_projs"])
    elif "proj_share_all_but_first" in hf:
        n = len(out.get("cutoffs", hf.get("cutoffs", ()))) + 1
        out["tie_projs"] = (False,) + (bool(hf["proj_share_all_but_first"]),) * (n - 1)
    if "div_val" in out and out["div_val"] > 1:
        out["proj_same_dim"] = True  # the PyTorch/HF code projects every cluster
    for key in ("mem_len", "clamp_len", "same_length", "tgt_len"):
        if key in out:
            out["eval_" + key] = out[key]
    return out


def memory_from_time_major(mems, n_layer, mem_len=None, dtype="float32"):
    """A tfxl `LayerInputMemory` (numpy states [B, L, M, D], valid [B, M]) from a reference
    implementation's `mems`: a list of time-major [M, B, D] arrays, for a model of `n_layer` layers.

    What the list holds depends on the implementation, so `n_layer` says which arrays to take:
      - n_layer arrays (TF1 `mems`, Hugging Face `TransfoXLLMHeadModel`): each layer's input,
        the first the scaled embedding; all are used.
      - n_layer + 1 arrays (PyTorch `MemTransformerLM`): the same, then the last layer's output,
        which no layer reads; the last array is dropped.
    Any other count raises ConversionError. `mem_len` (default M) pads on the left with invalid
    slots or keeps the last `mem_len` positions.
    """
    from tfxl.layers.memory import LayerInputMemory

    arrays = [np.asarray(m) for m in mems]
    if not arrays or any(a.ndim != 3 or a.shape != arrays[0].shape for a in arrays):
        raise ConversionError("mems must be a non-empty list of equal [M, B, D] arrays")
    if len(arrays) not in (n_layer, n_layer + 1):
        raise ConversionError(
            f"mems has {len(arrays)} arrays; a model of n_layer={n_layer} takes {n_layer} (TF1, "
            f"Hugging Face: each layer's input) or {n_layer + 1} (PyTorch MemTransformerLM: "
            "the same and the last layer's output, dropped)")
    states = np.stack(arrays[:n_layer], axis=0).transpose(2, 0, 1, 3)  # [B, L, M, D]
    batch, _, m, d = states.shape
    valid = np.ones((batch, m), bool)
    mem_len = m if mem_len is None else int(mem_len)
    if mem_len < m:
        states, valid = states[:, :, m - mem_len:], valid[:, m - mem_len:]
    elif mem_len > m:
        pad = mem_len - m
        states = np.concatenate([np.zeros((batch, n_layer, pad, d), states.dtype), states], 2)
        valid = np.concatenate([np.zeros((batch, pad), bool), valid], 1)
    return LayerInputMemory(states.astype(dtype), valid)


def describe(config):
    """One line per model setting that matters for conversion (used by the CLI log)."""
    return json.dumps({k: v for k, v in config.to_dict().items()
                       if k in ("vocab_size", "n_layer", "d_model", "n_head", "d_head",
                                "d_inner", "d_embed", "div_val", "cutoffs", "tie_weight",
                                "tie_projs", "proj_same_dim", "untie_r", "pre_lnorm",
                                "layer_norm_epsilon")}, sort_keys=True)
