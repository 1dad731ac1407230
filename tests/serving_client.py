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
out["init_states"], out["init_valid"] = memory["states"].numpy(), memory["valid"].numpy()

# Stream a document through `score`, one segment per request, carrying the memory.
pieces = []
for segment in np.split(inputs["document"], 3, axis=1):
    result = signatures["serving_default"](token_ids=tf.constant(segment), **memory)
    memory = {"states": result["states"], "valid": result["valid"]}
    pieces.append(result["log_probs"].numpy())
out["streamed_log_probs"] = np.concatenate(pieces, axis=1)
out["final_states"] = memory["states"].numpy()

sampling = dict(max_new_tokens=tf.constant(7), temperature=tf.constant(0.8),
                top_k=tf.constant(20), top_p=tf.constant(0.9), seed=tf.constant(5))
fresh = signatures["init_memory"](batch_size=tf.constant(2))
generated = signatures["generate"](prompt_ids=tf.constant(inputs["prompt"]), **fresh, **sampling)
out["generated_ids"] = generated["generated_ids"].numpy()
text = signatures["generate_text"](prompt=tf.constant([b"def f(", b"import os"]), **sampling)
out["text"] = text["text"].numpy().astype("S")
out["tfxl_imported"] = np.array(any(name.startswith("tfxl") for name in sys.modules))
np.savez(outputs_path, **out)
