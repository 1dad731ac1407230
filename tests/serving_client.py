"""Run as a subprocess: loads tfxl exports with TensorFlow only and calls every signature.

Usage: python serving_client.py INPUTS.npz [--saved_model_cli EXPORT_DIR SHOWN.txt]
                                EXPORT_DIR OUTPUTS.npz [EXPORT_DIR OUTPUTS.npz ...]

One process for several exports (each process start loads TensorFlow, seconds of CPU). With
--saved_model_cli, first TensorFlow's `saved_model_cli show --dir EXPORT_DIR --all` runs (its
console script, as a user runs it) and its exit status and output go to SHOWN.txt.
"""

import contextlib
import io
import os
import runpy
import sys

import numpy as np
import tensorflow as tf


def saved_model_cli_show(export_dir, shown_path):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    saved_argv, sys.argv = sys.argv, [cli, "show", "--dir", export_dir, "--all"]
    shown, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(shown):
            runpy.run_path(cli, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        sys.argv = saved_argv
    with open(shown_path, "w") as f:
        f.write(f"{code}\n{shown.getvalue()}")


def call_every_signature(export_dir, inputs):
    """Every signature of the export at `export_dir` called on `inputs`: its outputs by name."""
    signatures = tf.saved_model.load(export_dir).signatures
    out = {}

    memory = signatures["init_memory"](batch_size=tf.constant(2))
    for name in ("keys", "values", "valid"):
        out[f"init_{name}"] = memory[name].numpy()

    # Stream a document through `score`, one segment per request, carrying the key/value memory.
    pieces = []
    for segment in np.split(inputs["document"], 3, axis=1):
        result = signatures["serving_default"](token_ids=tf.constant(segment), **memory)
        memory = {name: result[name] for name in ("keys", "values", "valid")}
        pieces.append(result["log_probs"].numpy())
    out["streamed_log_probs"] = np.concatenate(pieces, axis=1)

    # Whole documents in one request each: no memory on the wire.
    for name, request in (
            ("document", dict(token_ids=inputs["long_document"])),
            ("masked", dict(token_ids=inputs["ragged_document"],
                            target_mask=inputs["target_mask"]))):
        signature = "score_document" if name == "document" else "score_document_masked"
        result = signatures[signature](**{k: tf.constant(v) for k, v in request.items()})
        for key in ("nll", "mean_nll", "tokens"):
            out[f"{name}_{key}"] = result[key].numpy()
    result = signatures["score_text"](text=tf.constant(inputs["texts"]))
    for key in ("nll", "tokens", "bpc"):
        out[f"text_{key}"] = result[key].numpy()

    sampling = dict(max_new_tokens=tf.constant(7), temperature=tf.constant(0.8),
                    top_k=tf.constant(20), top_p=tf.constant(0.9), seed=tf.constant(5))
    fresh = signatures["init_memory"](batch_size=tf.constant(2))
    generated = signatures["generate"](prompt_ids=tf.constant(inputs["prompt"]), **fresh,
                                       **sampling)
    out["generated_ids"] = generated["generated_ids"].numpy()
    out["generated_valid"] = generated["valid"].numpy()
    text = signatures["generate_text"](prompt=tf.constant([b"def f(", b"import os"]), **sampling)
    out["text"] = text["text"].numpy().astype("S")
    encoded = signatures["encode_text"](text=tf.constant("naïve"))["ids"]
    out["encoded_ids"] = encoded.numpy()
    out["decoded_text"] = np.array(signatures["decode_ids"](ids=encoded)["text"].numpy())
    return out


args = sys.argv[2:]
inputs = dict(np.load(sys.argv[1]))
if args[:1] == ["--saved_model_cli"]:
    saved_model_cli_show(*args[1:3])
    args = args[3:]
results = {outputs_path: call_every_signature(export_dir, inputs)
           for export_dir, outputs_path in zip(args[::2], args[1::2])}
tfxl_imported = any(name.startswith("tfxl") for name in sys.modules)
for outputs_path, out in results.items():
    np.savez(outputs_path, **out, tfxl_imported=np.array(tfxl_imported))
