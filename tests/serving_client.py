"""Run as a subprocess: loads a tfxl export with TensorFlow only and calls every signature.

Usage: python serving_client.py EXPORT_DIR INPUTS.npz OUTPUTS.npz
"""

import sys

import numpy as np
import tensorflow as tf

export_dir, inputs_path, outputs_path = sys.argv[1:4]
inputs = dict(np.load(inputs_path))
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
        ("masked", dict(token_ids=inputs["ragged_document"], target_mask=inputs["target_mask"]))):
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
generated = signatures["generate"](prompt_ids=tf.constant(inputs["prompt"]), **fresh, **sampling)
out["generated_ids"] = generated["generated_ids"].numpy()
out["generated_valid"] = generated["valid"].numpy()
text = signatures["generate_text"](prompt=tf.constant([b"def f(", b"import os"]), **sampling)
out["text"] = text["text"].numpy().astype("S")
encoded = signatures["encode_text"](text=tf.constant("naïve"))["ids"]
out["encoded_ids"] = encoded.numpy()
out["decoded_text"] = np.array(signatures["decode_ids"](ids=encoded)["text"].numpy())
out["tfxl_imported"] = np.array(any(name.startswith("tfxl") for name in sys.modules))
np.savez(outputs_path, **out)
